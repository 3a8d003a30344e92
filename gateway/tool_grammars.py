"""The grammars that hold a chat request's tool calls: a forced call's, and auto mode's when it must be held.

``tool_choice`` decides (gateway.messages ``ToolChoice``):

    required, named                 the prompt ends with the call's opener; ``forced_call_grammar``
                                    holds the rest of it to the named tool's parameters (required:
                                    any tool's, or, with OpenAI's ``allowed_tools``, an allowed one's,
                                    and then more such calls unless ``parallel_tool_calls`` is false)
    auto with ``allowed_tools``     ``auto_calls_grammar``: the model writes as it likes, but a call
                                    names an allowed tool (all tools stay in the prompt, so its prefix
                                    is the same whichever subset a turn allows: prompt reuse holds)
    auto, some tool ``strict``      ``auto_calls_grammar`` too: a call of a strict tool has arguments
                                    valid under its schema (OpenAI's promise for strict tools)
    auto otherwise, none            no grammar

A tool schema the library cannot hold exactly (``not``, an unknown
``format``, ...; in the XML format also a string parameter's ``format``, or a
``pattern`` the library cannot express as raw text) is held leniently, those
keywords unenforced: counted (``ignis:gateway_grammar_lenient_total``) each
time, and logged once per grammar (so once per tool schema and choice) with
each keyword named, never refused; one that does not compile even so is a 400
naming the library's reason. Without the library (llguidance not installed)
calls are served unheld: counted (``ignis:gateway_grammar_unheld_total``) and
named in the done line (the gateway warns of it at start). These run on the
prompt worker (tens of milliseconds for a large tool set), never on the loop.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

from ignis.gateway import grammars
from ignis.gateway.errors import invalid
from ignis.gateway.grammars import any_tool_call_grammar, grammar_warnings, tool_call_grammar, tool_calls_grammar
from ignis.gateway.metrics import GatewayMetrics
from ignis.gateway.output_parser import ForcedCall
from ignis.gateway.response_format import checked_grammar

log = logging.getLogger("ignis.gateway")

WARNED_GRAMMARS = 1024
"""Lenient grammars remembered as already logged (the oldest forgotten first)."""
_warned: OrderedDict[bytes, None] = OrderedDict()
_warned_lock = threading.Lock()


def allowed(tools: list[dict], names: tuple[str, ...] | None) -> list[dict]:
    """The tools a call may name: those in ``names`` (None: all)."""
    return tools if names is None else [t for t in tools if t["function"]["name"] in names]


def strict_names(tools: list[dict]) -> set[str]:
    return {t["function"]["name"] for t in tools if t["function"].get("strict") is True}


def _first_time(grammar: str) -> bool:
    """Whether ``grammar``'s leniency is logged now: the first time it is seen (of the last ``WARNED_GRAMMARS``)."""
    key = hashlib.blake2b(grammar.encode(), digest_size=16).digest()
    with _warned_lock:
        if key in _warned:
            _warned.move_to_end(key)
            return False
        _warned[key] = None
        while len(_warned) > WARNED_GRAMMARS:
            _warned.popitem(last=False)
        return True


def _held(build: Callable[[bool, list[str]], str], what: str, metrics: GatewayMetrics,
          said: list[str] | None = None) -> str | None:
    """``build(lenient, unenforced)``'s grammar: exact when the library holds it, else lenient; a grammar that
    leaves keywords unenforced (``unenforced``'s notes of the XML format's raw values, the library's warnings)
    is counted, logged once with each keyword named, and noted in ``said`` (the request's done line). None
    without the library: the calls go unheld, counted and noted."""
    if grammars.llguidance is None:
        metrics.grammar_unheld.inc()
        if said is not None:
            said.append(f"{what}: not held (llguidance is not installed)")
        return None
    notes: list[str] = []
    try:
        grammar = build(False, notes)
        error = checked_grammar(grammar)
    except ValueError as e:
        error = str(e)
    if error:
        notes = []
        try:
            grammar = build(True, notes)
        except ValueError as e:
            raise invalid(f"the {what} cannot be constrained: {e}", "tool_choice") from None
        still = checked_grammar(grammar)
        if still:
            raise invalid(f"the {what} cannot be constrained: {still}", "tool_choice")
        notes += grammar_warnings(grammar) or [error.splitlines()[0]]
    if notes:
        metrics.grammar_lenient.inc()
        if said is not None:
            said.append(f"{what}: schema held leniently")
        if _first_time(grammar):
            log.warning("%s: the tool schema is held leniently, these keywords unenforced: %s", what,
                        "; ".join(dict.fromkeys(notes)))
    return grammar


def forced_call_grammar(forced: ForcedCall, tools: list[dict], tool_format: str, metrics: GatewayMetrics,
                        allowed_names: tuple[str, ...] | None = None, several: bool = False,
                        said: list[str] | None = None) -> str | None:
    """The grammar of the rest of a forced call: the named tool's, or any (allowed) tool's for ``required``,
    then (``several``: parallel calls allowed) more calls of them as the model likes."""

    def build(lenient: bool, unenforced: list[str]) -> str:
        if forced.name is None:
            return any_tool_call_grammar(allowed(tools, allowed_names), tool_format, lenient, unenforced, several)
        tool = next(t for t in tools if t["function"]["name"] == forced.name)
        return tool_call_grammar(tool, tool_format, lenient, unenforced)

    return _held(build, f"tool_choice {forced.name or 'required'} call", metrics, said)


def auto_calls_grammar(tools: list[dict], tool_format: str, metrics: GatewayMetrics,
                       allowed_names: tuple[str, ...] | None = None, said: list[str] | None = None) -> str | None:
    """Auto mode's grammar, or None when nothing needs holding (no subset allowed, no strict tool)."""
    held = strict_names(tools)
    if allowed_names is None and not held:
        return None
    callable_tools = allowed(tools, allowed_names)
    return _held(lambda lenient, notes: tool_calls_grammar(callable_tools, tool_format, held, lenient, notes),
                 "allowed_tools" if allowed_names is not None else "strict tools' calls", metrics, said)
