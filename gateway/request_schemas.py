"""JSON Schemas of the routes' bodies and answers, for /openapi.json and the API fuzz tests.

Request schemas state what the parsers check field by field (types, ranges,
lengths, choices: ``gateway.params``, ``gateway.messages``,
``gateway.completions``, ``gateway.responses_api``), using the parsers' own
limits, so the document moves when a limit does. A body may carry any other
field (ignored as in OpenAI's API, and reported: ``gateway.ignored_fields``). Checks that need the
model or the whole body (the prompt fits the context, a named tool exists, a
template's own rules) are not in the schemas: they are 400s with a message.

Answer schemas give the shape of every JSON answer: the objects of OpenAI's
API that each route returns, and the error object of every 4xx/5xx.
"""

from __future__ import annotations

from ignis.gateway.bad_words import MAX_BAD_WORD_CHARS
from ignis.gateway.completions import MAX_PROMPTS
from ignis.gateway.request_ids import MAX_CHARS as MAX_REQUEST_ID_CHARS
from ignis.gateway.reasoning_effort import EFFORTS
from ignis.gateway.params import MAX_CACHE_KEY_CHARS, MAX_CACHE_SALT_CHARS, MAX_N, MAX_SEED, MAX_STOP_CHARS, MAX_STOPS
from ignis.gateway.structured_outputs import MAX_CHOICE_CHARS, MAX_CHOICES, MAX_SOURCE_CHARS
from ignis.shared.sampling import (
    LOGIT_BIAS_LIMIT,
    MAX_ALLOWED_TOKEN_IDS,
    MAX_BAD_WORDS,
    MAX_LOGIT_BIAS,
    MAX_STOP_TOKEN_IDS,
    MAX_THINKING_BUDGET,
    MAX_TOP_LOGPROBS,
)
from ignis.shared.wire import REQUEST_CLASSES

_STR = {"type": "string"}
_INT = {"type": "integer"}
_NUM = {"type": "number"}
_BOOL = {"type": "boolean"}
_NULLABLE_STR = {"type": ["string", "null"]}


def _obj(properties: dict, required: tuple[str, ...] = ()) -> dict:
    schema: dict = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


_STOP = {"oneOf": [{"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS},
                   {"type": "array", "maxItems": MAX_STOPS,
                    "items": {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}}]}

_SCHEMA_OR_TEXT = {"oneOf": [{"type": "object"}, {"type": "string", "maxLength": MAX_SOURCE_CHARS}]}
_SOURCE = {"type": "string", "maxLength": MAX_SOURCE_CHARS}
_CHOICES = {"type": "array", "minItems": 1, "maxItems": MAX_CHOICES,
            "items": {"type": "string", "maxLength": MAX_CHOICE_CHARS}}
STRUCTURED_OUTPUTS = {
    "structured_outputs": _obj({"json": _SCHEMA_OR_TEXT, "regex": _SOURCE, "choice": _CHOICES, "grammar": _SOURCE,
                                "json_object": _BOOL}),
    "guided_json": _SCHEMA_OR_TEXT,
    "guided_regex": _SOURCE,
    "guided_choice": _CHOICES,
    "guided_grammar": _SOURCE,
}
"""vLLM's structured-output fields (``gateway.structured_outputs``): one of them, and not beside a JSON
``response_format``; a regex or grammar the library refuses is a 400."""

SAMPLING = {
    "model": {"type": "string", "maxLength": 256},
    "stream": _BOOL,
    "n": {"type": "integer", "minimum": 1, "maximum": MAX_N},
    "stop": _STOP,
    "stop_token_ids": {"type": "array", "maxItems": MAX_STOP_TOKEN_IDS, "items": {"type": "integer", "minimum": 0}},
    "max_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": -1},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "repetition_penalty": {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
    "seed": {"type": "integer", "minimum": -MAX_SEED - 1, "maximum": MAX_SEED},
    "ignore_eos": _BOOL,
    "return_token_ids": _BOOL,
    "request_class": {"enum": list(REQUEST_CLASSES)},
    "priority": {"oneOf": [{"enum": list(REQUEST_CLASSES)}, {"type": "integer"}]},
    "prompt_cache_key": {"type": "string", "maxLength": MAX_CACHE_KEY_CHARS},
    "cache_salt": {"type": "string", "minLength": 1, "maxLength": MAX_CACHE_SALT_CHARS},
    "request_id": {"type": "string", "pattern": "^[!-~]{1,%d}$" % MAX_REQUEST_ID_CHARS},
    "logit_bias": {"type": "object", "maxProperties": MAX_LOGIT_BIAS, "propertyNames": {"pattern": "^[0-9]{1,10}$"},
                   "additionalProperties": {"type": "number", "minimum": -LOGIT_BIAS_LIMIT,
                                            "maximum": LOGIT_BIAS_LIMIT}},
    "min_tokens": {"type": "integer", "minimum": 0},
    "prompt_logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
    "allowed_token_ids": {"type": "array", "minItems": 1, "maxItems": MAX_ALLOWED_TOKEN_IDS,
                          "items": {"type": "integer", "minimum": 0}},
    "bad_words": {"type": "array", "maxItems": MAX_BAD_WORDS,
                  "items": {"type": "string", "minLength": 1, "maxLength": MAX_BAD_WORD_CHARS, "pattern": "\\S"}},
    "include_stop_str_in_output": _BOOL,
    "skip_special_tokens": _BOOL,
    "spaces_between_special_tokens": _BOOL,
    "return_tokens_as_token_ids": _BOOL,
    "truncate_prompt_tokens": {"oneOf": [{"const": -1}, {"type": "integer", "minimum": 1}]},
    **STRUCTURED_OUTPUTS,
}
"""The fields /v1/chat/completions and /v1/completions share (``gateway.params``)."""

_TEXT_PART = _obj({"type": {"const": "text"}, "text": _STR}, ("type", "text"))
_IMAGE_PART = _obj({"type": {"const": "image_url"}, "image_url": {"oneOf": [
    {"type": "string", "minLength": 1},
    _obj({"url": {"type": "string", "minLength": 1}, "detail": {"enum": ["auto", "low", "high"]}}, ("url",))]}},
    ("type", "image_url"))
"""An image: a data: URL (PNG, JPEG, WebP, GIF), or an http(s) URL of a host --allowed-media-domains lists;
a model without a vision encoder answers it 400."""
_CONTENT = {"oneOf": [_STR, {"type": "array", "items": {"oneOf": [_TEXT_PART, _IMAGE_PART]}}, {"type": "null"}]}
_FUNCTION = _obj({"name": {"type": "string", "minLength": 1, "maxLength": 64}, "description": _STR,
                  "parameters": {"type": "object"}, "strict": _BOOL}, ("name",))
_TOOL_CALL = _obj({"id": {"type": "string", "maxLength": 256}, "type": {"const": "function"},
                   "function": _obj({"name": _STR, "arguments": _STR}, ("name", "arguments"))}, ("function",))
_MESSAGE = _obj({"role": {"enum": ["system", "developer", "user", "assistant", "tool"]}, "content": _CONTENT,
                 "name": {"type": "string", "maxLength": 256}, "tool_calls": {"type": "array", "items": _TOOL_CALL},
                 "tool_call_id": {"type": "string", "maxLength": 256}, "reasoning_content": _STR},
                ("role",))

CHAT_COMPLETIONS = _obj({
    **SAMPLING,
    "messages": {"type": "array", "minItems": 1, "items": _MESSAGE},
    "max_completion_tokens": {"type": "integer", "minimum": 1},
    "stream_options": _obj({"include_usage": _BOOL, "continuous_usage_stats": _BOOL}),
    "logprobs": _BOOL,
    "top_logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
    "tools": {"type": "array", "items": _obj({"type": {"const": "function"}, "function": _FUNCTION}, ("function",))},
    "tool_choice": {"oneOf": [{"enum": ["none", "auto", "required"]},
                              _obj({"type": {"const": "function"}, "function": _obj({"name": _STR}, ("name",))},
                                   ("function",))]},
    "response_format": _obj({"type": {"enum": ["text", "json_object", "json_schema"]},
                             "json_schema": _obj({"name": _STR, "schema": {"type": "object"}, "strict": _BOOL})},
                            ("type",)),
    "chat_template_kwargs": {"type": "object"},
    "parallel_tool_calls": _BOOL,
    "continue_final_message": _BOOL,
    "add_generation_prompt": _BOOL,
    "thinking_token_budget": {"type": "integer", "minimum": 0, "maximum": MAX_THINKING_BUDGET},
    "reasoning_effort": {"enum": list(EFFORTS)},
    "include_reasoning": _BOOL,
    "echo": _BOOL,
}, ("messages",))

COMPLETIONS = _obj({
    **SAMPLING,
    "prompt": {"oneOf": [{"type": "string", "minLength": 1},
                         {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
                         {"type": "array", "minItems": 1, "maxItems": MAX_PROMPTS,
                          "items": {"oneOf": [{"type": "string", "minLength": 1},
                                              {"type": "array", "minItems": 1,
                                               "items": {"type": "integer", "minimum": 0}}]}}]},
    "max_tokens": {"type": "integer", "minimum": 0,
                   "description": "0 only with echo: the prompt is the answer (scored with logprobs), nothing generated"},
    "logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
    "echo": _BOOL,
    "stream_options": _obj({"include_usage": _BOOL, "continuous_usage_stats": _BOOL}),
}, ("prompt",))

_INPUT_ITEM = _obj({"type": {"enum": ["message", "function_call", "function_call_output", "reasoning"]},
                    "role": {"enum": ["system", "developer", "user", "assistant"]},
                    "content": {"oneOf": [_STR, {"type": "array", "items": {"oneOf": [_obj(
                        {"type": {"enum": ["input_text", "output_text"]}, "text": _STR}, ("type", "text")),
                        _obj({"type": {"const": "input_image"}, "image_url": {"type": "string", "minLength": 1},
                              "detail": {"enum": ["auto", "low", "high"]}}, ("type", "image_url"))]}}]},
                    "call_id": _STR, "name": _STR, "arguments": _STR, "output": _STR})
_ITEMS = {"oneOf": [_STR, {"type": "array", "items": _INPUT_ITEM}]}

RESPONSES = _obj({
    "model": {"type": "string", "maxLength": 256},
    "input": _ITEMS,
    "instructions": {"oneOf": [_STR, {"type": "array", "items": _INPUT_ITEM}, {"type": "null"}]},
    "previous_response_id": {"type": "string", "maxLength": 256},
    "max_output_tokens": {"type": "integer", "minimum": 1},
    "temperature": SAMPLING["temperature"], "top_p": SAMPLING["top_p"], "seed": SAMPLING["seed"],
    "stream": _BOOL, "store": _BOOL, "parallel_tool_calls": _BOOL, "background": _BOOL,
    "truncation": {"enum": ["auto", "disabled", None]},
    "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
    "tools": {"type": "array", "items": _obj({"type": _STR}, ("type",))},
    "tool_choice": {"oneOf": [{"enum": ["none", "auto", "required"]}, _obj({"type": _STR}, ("type",))]},
    "reasoning": _obj({"effort": {"enum": ["none", "minimal", "low", "medium", "high", "xhigh", None]},
                       "summary": _NULLABLE_STR}),
    "text": _obj({"format": _obj({"type": {"enum": ["text", "json_object", "json_schema"]}}, ("type",))}),
    "metadata": {"type": "object", "additionalProperties": _STR},
    "include": {"type": "array", "items": _STR},
    "max_tool_calls": {"type": "integer", "minimum": 1},
    "prompt_cache_key": SAMPLING["prompt_cache_key"],
    "cache_salt": SAMPLING["cache_salt"],
}, ("input",))

TOKENIZE = {**_obj({
    "model": SAMPLING["model"],
    "prompt": _STR,
    "messages": CHAT_COMPLETIONS["properties"]["messages"],
    "tools": CHAT_COMPLETIONS["properties"]["tools"],
    "chat_template_kwargs": {"type": "object"},
    "add_generation_prompt": _BOOL, "add_special_tokens": _BOOL, "return_token_strs": _BOOL,
}), "oneOf": [{"required": ["prompt"], "not": {"required": ["messages"]}},
              {"required": ["messages"], "not": {"required": ["prompt"]}}]}

_BLOCK = {"type": "object", "properties": {"type": _STR}, "required": ["type"]}
_BLOCKS = {"oneOf": [_STR, {"type": "array", "items": _BLOCK}]}
MESSAGES = _obj({
    "model": SAMPLING["model"],
    "max_tokens": {"type": "integer", "minimum": 1},
    "messages": {"type": "array", "minItems": 1, "items": _obj({"role": {"enum": ["user", "assistant"]},
                                                               "content": _BLOCKS}, ("role", "content"))},
    "system": _BLOCKS,
    "stop_sequences": {"type": "array", "maxItems": MAX_STOPS,
                       "items": {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}},
    "temperature": SAMPLING["temperature"], "top_p": SAMPLING["top_p"], "top_k": SAMPLING["top_k"],
    "stream": _BOOL,
    "tools": {"type": "array", "items": _obj({"name": _STR, "description": _STR, "input_schema": {"type": "object"}},
                                             ("name",))},
    "tool_choice": _obj({"type": {"enum": ["auto", "any", "tool", "none"]}, "name": _STR,
                         "disable_parallel_tool_use": _BOOL}, ("type",)),
    "thinking": _obj({"type": {"enum": ["enabled", "disabled", "adaptive"]}, "budget_tokens": {"type": "integer", "minimum": 1}},
                     ("type",)),
}, ("max_tokens", "messages"))
"""Anthropic's Messages API body (``gateway.messages_api``)."""

COUNT_TOKENS = {**MESSAGES, "required": ["messages"]}

DETOKENIZE = _obj({"model": SAMPLING["model"], "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}}},
                  ("tokens",))

LORA_NAME = {"type": "string", "minLength": 1, "maxLength": 256}
LOAD_LORA = _obj({"lora_name": dict(LORA_NAME, pattern="^[!-~]+$"), "lora_path": {"type": "string", "minLength": 1, "maxLength": 4096}},
                 ("lora_name", "lora_path"))
UNLOAD_LORA = _obj({"lora_name": LORA_NAME}, ("lora_name",))

REQUESTS = {"/v1/chat/completions": CHAT_COMPLETIONS, "/v1/completions": COMPLETIONS, "/v1/responses": RESPONSES,
            "/tokenize": TOKENIZE, "/detokenize": DETOKENIZE, "/v1/messages": MESSAGES,
            "/v1/messages/count_tokens": COUNT_TOKENS, "/v1/load_lora_adapter": LOAD_LORA,
            "/v1/unload_lora_adapter": UNLOAD_LORA,
            "/start_profile": _obj({"num_steps": {"type": "integer", "minimum": 1, "maximum": 1_000_000}})}
"""The JSON body of each POST route."""

STREAMING = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
"""The POST routes that answer server-sent events with ``stream: true``."""

# ----- answers --------------------------------------------------------------------

ERROR = _obj({"error": _obj({"message": _STR, "type": _STR, "param": _NULLABLE_STR,
                             "code": {"type": ["string", "integer", "null"]}}, ("message", "type"))}, ("error",))

_USAGE = _obj({"prompt_tokens": _INT, "completion_tokens": _INT, "total_tokens": _INT,
               "prompt_tokens_details": _obj({"cached_tokens": _INT}),
               "completion_tokens_details": _obj({"reasoning_tokens": _INT})},
              ("prompt_tokens", "completion_tokens", "total_tokens"))
_CHOICE_MESSAGE = _obj({"role": {"const": "assistant"}, "content": _NULLABLE_STR,
                        "tool_calls": {"type": "array", "items": _TOOL_CALL}}, ("role",))
_FINISH = {"type": ["string", "null"]}

CHAT_COMPLETION = _obj({
    "id": _STR, "object": {"const": "chat.completion"}, "created": _INT, "model": _STR,
    "choices": {"type": "array", "items": _obj({"index": _INT, "message": _CHOICE_MESSAGE, "finish_reason": _FINISH},
                                               ("index", "message", "finish_reason"))},
    "usage": _USAGE,
}, ("id", "object", "created", "model", "choices"))

TEXT_COMPLETION = _obj({
    "id": _STR, "object": {"const": "text_completion"}, "created": _INT, "model": _STR,
    "choices": {"type": "array", "items": _obj({"index": _INT, "text": _STR, "finish_reason": _FINISH},
                                               ("index", "text", "finish_reason"))},
    "usage": _USAGE,
}, ("id", "object", "created", "model", "choices"))

RESPONSE = _obj({"id": _STR, "object": {"const": "response"}, "created_at": _NUM, "model": _STR,
                 "status": {"enum": ["completed", "incomplete", "failed", "in_progress", "queued", "cancelled"]},
                 "output": {"type": "array", "items": _obj({"type": _STR}, ("type",))}},
                ("id", "object", "model", "status", "output"))

ANTHROPIC_ERROR = _obj({"type": {"const": "error"},
                        "error": _obj({"type": _STR, "message": _STR}, ("type", "message"))}, ("type", "error"))
"""The error object of the Messages API routes."""
SSE_EVENT = _obj({"event": _STR, "data": _STR, "id": _STR}, ("data",))
"""One server-sent event of a streamed answer (its data: a JSON chunk, or ``[DONE]``)."""

_MODEL = _obj({"id": _STR, "object": {"const": "model"}, "created": _INT, "owned_by": _STR, "type": {"const": "model"},
               "display_name": _STR, "created_at": _STR, "max_model_len": _INT}, ("id", "object"))

ANSWERS = {
    ("POST", "/v1/chat/completions"): CHAT_COMPLETION,
    ("POST", "/v1/completions"): TEXT_COMPLETION,
    ("POST", "/v1/responses"): RESPONSE,
    ("GET", "/v1/responses/{response_id}"): RESPONSE,
    ("POST", "/v1/responses/{response_id}/cancel"): RESPONSE,
    ("GET", "/v1/responses/{response_id}/input_items"): _obj(
        {"object": {"const": "list"},
         "data": {"type": "array", "items": _obj({"id": _STR, "type": _STR}, ("id", "type"))},
         "first_id": _NULLABLE_STR, "last_id": _NULLABLE_STR, "has_more": _BOOL},
        ("object", "data", "first_id", "last_id", "has_more")),
    ("DELETE", "/v1/responses/{response_id}"): _obj({"id": _STR, "object": _STR, "deleted": _BOOL},
                                                    ("id", "deleted")),
    ("GET", "/v1/models"): _obj({"object": {"const": "list"}, "data": {"type": "array", "items": _MODEL},
                                 "has_more": _BOOL, "first_id": _STR, "last_id": _STR}, ("object", "data")),
    ("GET", "/v1/models/{model}"): _MODEL,
    ("POST", "/tokenize"): _obj({"count": _INT, "max_model_len": {"type": ["integer", "null"]},
                                 "tokens": {"type": "array", "items": _INT},
                                 "token_strs": {"type": "array", "items": _STR}}, ("count", "max_model_len", "tokens")),
    ("POST", "/detokenize"): _obj({"prompt": _STR}, ("prompt",)),
    ("POST", "/v1/messages"): _obj({"id": _STR, "type": {"const": "message"}, "role": {"const": "assistant"},
                                    "model": _STR, "content": {"type": "array", "items": _BLOCK},
                                    "stop_reason": {"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use",
                                                             None]},
                                    "stop_sequence": _NULLABLE_STR,
                                    "usage": _obj({"input_tokens": _INT, "output_tokens": _INT,
                                                   "cache_read_input_tokens": _INT,
                                                   "cache_creation_input_tokens": _INT},
                                                  ("input_tokens", "output_tokens"))},
                                   ("id", "type", "role", "content", "stop_reason", "usage")),
    ("POST", "/v1/messages/count_tokens"): _obj({"input_tokens": _INT}, ("input_tokens",)),
    ("GET", "/health"): _obj({"status": _STR}, ("status",)),
    ("GET", "/ping"): _obj({"status": _STR}, ("status",)),
    ("POST", "/ping"): _obj({"status": _STR}, ("status",)),
    ("GET", "/health_generate"): _obj({"status": _STR}, ("status",)),
    ("GET", "/load"): _obj({"server_load": _INT}, ("server_load",)),
    ("GET", "/get_load"): {"type": "array", "items": _obj(
        {"dp_rank": _INT, "num_reqs": _INT, "num_waiting_reqs": _INT, "num_tokens": _INT},
        ("dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"))},
    ("GET", "/is_sleeping"): _obj({"is_sleeping": _BOOL}, ("is_sleeping",)),
    ("GET", "/get_model_info"): _obj({"model_path": _NULLABLE_STR, "tokenizer_path": _NULLABLE_STR,
                                      "served_model_name": _STR, "is_generation": _BOOL,
                                      "has_image_understanding": _BOOL, "has_audio_understanding": _BOOL,
                                      "max_model_len": {"type": ["integer", "null"]}},
                                     ("served_model_name", "is_generation")),
    **{("GET", path): _obj({"version": _STR, "served_model_name": _STR, "server_args": {"type": "object"},
                            "internal_states": {"type": "array", "items": {"type": "object"}}},
                           ("version", "served_model_name", "server_args", "internal_states"))
       for path in ("/server_info", "/get_server_info")},
    ("GET", "/tokenizer_info"): {"type": "object"},
    ("GET", "/version"): _obj({"version": _STR}, ("version",)),
    ("POST", "/start_profile"): _obj({"profiling": {"const": True}}, ("profiling",)),
    ("POST", "/stop_profile"): _obj({"profiling": {"const": False}, "trace": _STR, "summary": _STR,
                                     "message": _STR}, ("profiling", "trace", "summary")),
    **{(method, path): _obj({"flushed": {"const": True}, "retained_entries": {"type": "integer", "minimum": 0}},
                            ("flushed", "retained_entries"))
       for method, path in (("POST", "/reset_prefix_cache"), ("POST", "/flush_cache"), ("GET", "/flush_cache"))},
}
"""The JSON answer (status 200) of each route that answers JSON."""
