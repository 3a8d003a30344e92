"""Which tool-call format a model writes, its block parsers, and the prompt text that forces a call.

    format     chosen by                                   a call looks like
    qwen3_xml  --tool-call-parser, or auto: the template   <tool_call>\\n<function=NAME>\\n<parameter=P>...
               shows <function= (Qwen3.5)
    hermes     --tool-call-parser, or auto otherwise        <tool_call>\\n{"name": NAME, "arguments": {...}}
               (Qwen3, Qwen3-Next)

``forced_call_suffix`` is what a request with ``tool_choice`` "required" (any
call) or a named function appends to the rendered prompt: the call opener, so
the model continues inside the call, after closing a ``<think>`` block the
generation prompt left open (a forced call has no reasoning). Pure Python.
"""

from __future__ import annotations

from ignis.gateway.config import TOOL_CALL_PARSERS
from ignis.gateway.reasoning_split import THINK_CLOSE
from ignis.gateway.tool_call_hermes import HermesCallBlock, hermes_opener, parse_hermes_block
from ignis.gateway.tool_call_xml import XmlCallBlock, parse_xml_block, xml_opener

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
FORMATS = tuple(p for p in TOOL_CALL_PARSERS if p != "auto")


def resolve_format(setting: str, template_source: str | None) -> str:
    """The format for ``--tool-call-parser`` ``setting`` and the model's chat template text."""
    if setting in FORMATS:
        return setting
    if setting != "auto":
        raise ValueError(f"--tool-call-parser must be one of {', '.join(TOOL_CALL_PARSERS)}, got {setting!r}")
    return "qwen3_xml" if template_source and "<function=" in template_source else "hermes"


def forced_call_suffix(fmt: str, name: str | None, in_reasoning: bool) -> str:
    """Prompt text forcing a call of ``name`` (any call when None) in ``fmt``; ``in_reasoning``: the
    prompt leaves ``<think>`` open (it is closed empty first, as templates close it)."""
    opener = xml_opener(name) if fmt == "qwen3_xml" else hermes_opener(name)
    return ("\n" + THINK_CLOSE + "\n\n" if in_reasoning else "") + TOOL_OPEN + opener


def block_parser(fmt: str, types: dict, forced_name: str | None = None):
    """A parser for one block body: ``push(text)`` and ``close(closed)`` give ("header"|"args", text) events."""
    return XmlCallBlock(types, forced_name) if fmt == "qwen3_xml" else HermesCallBlock(forced_name, frozenset(types))


def parse_other_format(fmt: str, body: str, types: dict) -> tuple[str, str] | None:
    """A block the model wrote in the format it was not asked for: ``(name, arguments)`` or None."""
    return parse_hermes_block(body) if fmt == "qwen3_xml" else parse_xml_block(body, types)
