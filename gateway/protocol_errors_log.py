"""Malformed HTTP off the wire is a warning line, not an error with a traceback.

aiohttp answers a request its parser refuses (duplicate Content-Length, a line
past its bound, too many headers, a br body without the Brotli module) with a 400 and
logs "Error handling request" at ERROR with the parser's traceback: any
client could fill the journal at will. ``quiet_protocol_errors()`` puts a
filter on aiohttp's server logger that drops those records for one WARNING
line of the gateway's naming the parser's complaint, at most a few a second
(``RateLimitedLog``'s budget; the next line that passes says how many were
held back). Every other
record, a handler's own failure included, passes unchanged.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

from ignis.shared.log_limits import RateLimitedLog

SERVER_LOGGER = "aiohttp.server"


class ProtocolErrorFilter(logging.Filter):
    def __init__(self, per_s: float = 1.0, burst: int = 10):
        super().__init__()
        self.budget = RateLimitedLog(logging.getLogger("ignis.gateway"), per_s, burst)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        detail = " ".join(str(getattr(exc, "message", "") or exc).split())[:200]
        self.budget.warning("malformed HTTP request refused with %d: %s", getattr(exc, "code", 400) or 400, detail)
        return False


def quiet_protocol_errors() -> ProtocolErrorFilter:
    """Install the filter on aiohttp's server logger (once); returns it."""
    logger = logging.getLogger(SERVER_LOGGER)
    for f in logger.filters:
        if isinstance(f, ProtocolErrorFilter):
            return f
    f = ProtocolErrorFilter()
    logger.addFilter(f)
    return f
