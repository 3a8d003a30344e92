"""OpenAI-style error objects, and the mapping of engine refusals to HTTP statuses.

Every error a client sees is ``{"error": {"message", "type", "param", "code"}}``
with an HTTP status:

    400 invalid_request_error        a bad field (param names it), context_length_exceeded, malformed JSON
    401 authentication_error         missing or wrong API key
    404 not_found_error              unknown model (code model_not_found) or route
    408 invalid_request_error        the body did not arrive within --body-read-timeout (code body_timeout)
    413 invalid_request_error        body over the byte limit (code request_too_large)
    415 invalid_request_error        a POST whose Content-Type is not application/json
    429 rate_limit_error             engine queue full (Retry-After)
    503 service_unavailable_error    engine down, unreachable or shutting down (Retry-After)
    500 internal_error               a gateway bug; the message carries a request id (also in the
                                     X-Request-Id header) that the logged traceback names too;
                                     never a trace or a path

A prompt past the context (``ContextTooLong``) is worded as each API's own
service words it, because agent clients read those words: OpenAI's "This
model's maximum context length is N tokens. However, ..." (with the counts
that clients parse to compact their history) and Anthropic's "prompt is too
long: P tokens > N maximum" or "input length and `max_tokens` exceed context
limit: P + M > N, ..." (Claude Code compacts on the first and retries with a
smaller ``max_tokens`` on the second).
"""

from __future__ import annotations

import orjson
from aiohttp import web

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 408: "invalid_request_error",
          413: "invalid_request_error", 415: "invalid_request_error",
          429: "rate_limit_error", 500: "internal_error", 503: "service_unavailable_error"}

RETRY_AFTER_S = 1


class ApiError(Exception):
    """An error answered to the client as an OpenAI error object."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None, retry_after: int | None = None, close: bool = False,
                 headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error")
        self.retry_after = retry_after
        self.close = close  # close the connection after answering
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def renamed(self, param: str) -> ApiError:
        """This error naming ``param`` instead (in its message too): a field as the client's API spells it."""
        if self.param is None or param == self.param:
            return self
        err = self._clone()
        err.message, err.param = self.message.replace(self.param, param), param
        err.args = (err.message,)
        return err

    def _clone(self) -> ApiError:
        """A copy of this error, of its class (``copy.copy`` would call ``__init__`` with the message alone)."""
        err = type(self).__new__(type(self))
        err.__dict__.update(self.__dict__)
        err.args = self.args
        return err

    def anthropic_body(self) -> dict:
        """The error in Anthropic's shape (its Messages API routes)."""
        kinds = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}
        kind = kinds.get(self.status, "invalid_request_error" if self.status < 500 else "api_error")
        message = self.message
        if self.code == "context_length_exceeded" and not message.startswith("prompt is too long"):
            message = "prompt is too long: " + message  # the words Anthropic's clients look for
        return {"type": "error", "error": {"type": kind, "message": message}}

    def response(self, anthropic: bool = False) -> web.Response:
        headers = dict(self.headers)
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        body = self.anthropic_body() if anthropic else self.body()
        resp = web.Response(status=self.status, body=orjson.dumps(body), content_type="application/json",
                            headers=headers)
        if self.close:
            resp.force_close()
        return resp


def invalid(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def context_length_exceeded(message: str) -> ApiError:
    return ApiError(400, message, param="messages", code="context_length_exceeded")


class ContextTooLong(ApiError):
    """A prompt of ``prompt`` tokens (and ``completion`` tokens asked for, when that is what overflows) past a
    context of ``limit``; ``field``: what holds the prompt (``messages`` for chat, ``prompt`` for completions)."""

    def __init__(self, limit: int, prompt: int, completion: int | None = None, field: str = "messages"):
        self.limit, self.prompt, self.completion = limit, prompt, completion
        head = f"This model's maximum context length is {limit} tokens. However, "
        if completion is None:
            message = (f"{head}your {field} resulted in {prompt} tokens. Please reduce the length of the "
                       f"{field}.")
        else:
            message = (f"{head}you requested {prompt + completion} tokens ({prompt} in the {field}, {completion} "
                       f"in the completion). Please reduce the length of the {field} or completion.")
        super().__init__(400, message, param=field, code="context_length_exceeded")

    def renamed(self, param: str) -> ApiError:
        """The field renamed; the words stay (clients match them as they are)."""
        err = self._clone()
        err.param = param
        return err

    def anthropic_body(self) -> dict:
        if self.completion is None:
            message = f"prompt is too long: {self.prompt} tokens > {self.limit} maximum"
        else:
            message = (f"input length and `max_tokens` exceed context limit: {self.prompt} + {self.completion} > "
                       f"{self.limit}, decrease input length or `max_tokens` and try again")
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}


def engine_unavailable(message: str = "the engine is not answering; try again shortly") -> ApiError:
    return ApiError(503, message, code="engine_unavailable", retry_after=RETRY_AFTER_S)


def from_refusal(reason: str, message: str) -> ApiError:
    """The client's view of an engine ``Refused``."""
    if reason == "queue_full":
        return ApiError(429, f"the server is busy: {message}", code="queue_full", retry_after=RETRY_AFTER_S)
    if reason == "too_long":
        return context_length_exceeded(message)
    if reason == "unknown_model":
        return ApiError(404, message, param="model", code="model_not_found")
    if reason == "shutting_down":
        return ApiError(503, message, code="shutting_down", retry_after=RETRY_AFTER_S)
    return invalid(message)


def from_http_exception(exc: web.HTTPException) -> ApiError:
    """aiohttp's own errors (no route, wrong method, body too large) as error objects."""
    status = exc.status
    if status == 404:
        return ApiError(404, "no such route", code="not_found")
    if status == 405:  # with the methods the route takes (RFC 9110 requires Allow on a 405)
        allow = exc.headers.get("Allow")
        return ApiError(405, "method not allowed on this route", code="method_not_allowed",
                        headers={"Allow": allow} if allow else None)
    if status == 413:
        return ApiError(413, "the request body is too large", code="request_too_large")
    if status == 408:
        return ApiError(408, "the request did not arrive in time", code="request_timeout", close=True)
    return ApiError(status, exc.reason or "request failed")
