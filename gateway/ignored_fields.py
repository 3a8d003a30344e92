"""Request fields that were sent and had no effect: answered, and reported.

OpenAI's API ignores the fields it does not know, and so does ignis; but a
client that sends one (an option ignis does not have, a misspelt name:
``max_token``) should be able to learn that it changed nothing. After a
generation request is read, the top-level fields nothing asked for
(``Fields.unread``) are reported: the first request to send each name on an
endpoint is a warning, every one is counted in
``ignis:gateway_request_fields_ignored_total{endpoint}`` and named in the
request's done line ("ignored fields: ...", ``Generate.notes``).

A few fields are ignored on purpose and not reported (``ACCEPTED``): they ask
nothing of the server that answers (an end-user id, the vendor's own storage,
billing and retention hints), so SDKs and agent clients send them every time.
"""

from __future__ import annotations

import logging

from ignis.gateway.fields import Fields
from ignis.gateway.metrics import GatewayMetrics

log = logging.getLogger("ignis.gateway")

_VENDOR_HINTS = frozenset({"user", "service_tier", "safety_identifier", "prompt_cache_retention"})
ACCEPTED: dict[str, frozenset[str]] = {
    "chat": _VENDOR_HINTS | {"store", "metadata"},
    "completions": _VENDOR_HINTS,
    # stream_options' one key (include_obfuscation) pads events against a side channel over the vendor's network
    "responses": _VENDOR_HINTS | {"stream_options", "client_metadata"},  # Codex sends client_metadata each turn
    "messages": frozenset({"metadata", "service_tier"}),
}
"""Per endpoint (the metrics' label): the fields taken without effect on purpose (not reported)."""

MAX_LOGGED = 8
"""New names one request may warn about (the rest of its names are counted in the line, and warned about
when a later request sends them)."""

MAX_NAME_CHARS = 64
"""A reported name is cut to this many characters (names are the client's)."""


def report_unread(f: Fields, endpoint: str, metrics: GatewayMetrics, notes: list[str]) -> list[str]:
    """Report ``f``'s unread top-level fields (less ``endpoint``'s accepted ones); returns their names."""
    accepted = ACCEPTED.get(endpoint, frozenset())
    names = [_shown(name) for name in f.unread() if name not in accepted]
    if not names:
        return names
    metrics.fields_ignored.labels(metrics.model_name, endpoint).inc(len(names))
    fresh: list[str] = []
    for name in names:  # a request's first few new names: one request of junk names fills little
        if len(fresh) == MAX_LOGGED:
            break
        if metrics.first_ignored(endpoint, name):
            fresh.append(name)
    if fresh:
        more = f" (of {len(names)} ignored in this request)" if len(names) > len(fresh) else ""
        log.warning("%s: request field%s %s ignored%s (ignis does not read %s; counted in "
                    "ignis:gateway_request_fields_ignored_total, named in each done line)", endpoint,
                    "s" if len(fresh) > 1 else "", ", ".join(map(repr, fresh)), more,
                    "them" if len(fresh) > 1 else "it")
    notes.append("ignored fields: " + ", ".join(names))  # the done line cuts it to its note length
    return names


def _shown(name: str) -> str:
    name = name if name.isprintable() else name.encode("unicode_escape").decode("ascii")
    return name if len(name) <= MAX_NAME_CHARS else name[:MAX_NAME_CHARS - 3] + "..."
