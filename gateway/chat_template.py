"""Chat template rendering with jinja2, the way transformers' ``apply_chat_template`` renders.

The environment mirrors transformers (``utils/chat_template_utils.py``): an
``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with
the loop-controls extension, ``tojson`` as ``json.dumps(ensure_ascii=False)``
(with its indent/separators/sort_keys options), and the globals
``raise_exception``, ``strftime_now``, a restricted ``dict`` and a
``namespace`` that refuses underscore names. Template variables are the
tokenizer's special tokens, then the caller's extra kwargs, then ``messages``,
``tools``, ``documents`` and ``add_generation_prompt``. Messages are passed
with their ``None``-valued keys dropped, and ``reasoning_content`` is also
offered as ``thinking``, as transformers does. A content of text parts is
joined by newlines into one string where the template reads a content as a
string (vLLM's content format), and always in a tool result (as vLLM and
SGLang hand tool results to templates).

A template that fails (``raise_exception``, a syntax error, a type error
inside) raises ``TemplateRenderError`` with the template's own message.
``takes_late_system`` says, from one probe render, whether a system turn
after the first message is rendered (some templates raise, or drop it).
``template_option`` reads ``--chat-template``: a file's text, or the template
text itself.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_LATE_SYSTEM_PROBE = "Late system turn probe."


class TemplateRenderError(ValueError):
    """The chat template refused or failed to render these messages."""


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


class _TemplateDict:
    """``dict(...)`` for templates without exposing the type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """A jinja namespace that refuses underscore-prefixed attributes."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace, got {name!r}")


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


def _template_message(message: dict, join_parts: bool = False) -> dict:
    out = {k: v for k, v in message.items() if v is not None}
    content = out.get("content")
    if (join_parts or out.get("role") == "tool") and isinstance(content, list) \
            and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        # vLLM's string content format; a tool result's text parts are joined so whatever the format (as vLLM
        # and SGLang join them: templates render a tool result as one text)
        out["content"] = "\n".join(p["text"] for p in content)
    reasoning = next((out[k] for k in _REASONING_FIELDS if out.get(k) is not None), None)
    if reasoning is not None:
        out = {"thinking": reasoning, **out, "reasoning_content": reasoning}
    return out


MAX_TEMPLATE_BYTES = 1 << 20


def template_option(value: str) -> str:
    """The template ``--chat-template`` names: the text of the file at ``value``, or ``value`` itself when it
    is template text (it holds ``{{`` or ``{%``). Raises ValueError naming the flag when neither."""
    path = Path(value).expanduser()
    try:
        is_file = path.is_file()
    except (OSError, ValueError):  # a name too long to be a path, or with a NUL: template text or nothing
        is_file = False
    if is_file:
        try:
            if path.stat().st_size > MAX_TEMPLATE_BYTES:
                raise ValueError(f"--chat-template {value}: the file is larger than {MAX_TEMPLATE_BYTES} bytes")
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--chat-template {value}: cannot read the file: {e}") from None
    if "{{" in value or "{%" in value:
        return value
    raise ValueError(f"--chat-template {value!r}: no such file, and not template text (no '{{{{' or '{{%')")


def _names_content(node, aliases: frozenset[str] = frozenset({"content"})) -> bool:
    """``node`` reads a content: ``content`` (or another name in ``aliases``), ``x.content``,
    ``x['content']`` (through filters too)."""
    nodes = jinja2.nodes
    if isinstance(node, nodes.Name):
        return node.name in aliases
    if isinstance(node, nodes.Getattr):
        return node.attr == "content"
    if isinstance(node, nodes.Getitem):
        return isinstance(node.arg, nodes.Const) and node.arg.value == "content"
    if isinstance(node, (nodes.Filter, nodes.Test)):
        return node.node is not None and _names_content(node.node, aliases)
    if isinstance(node, nodes.CondExpr):  # ``m.content if m.content else ''``
        return _names_content(node.expr1, aliases) or (node.expr2 is not None
                                                        and _names_content(node.expr2, aliases))
    return False


def _content_aliases(tree) -> frozenset[str]:
    """The names a template gives a message's content: ``{% set c = message.content %}``, and a macro's
    parameter that some call passes a content in (``{% macro show(c) %}`` ... ``show(m['content'])``),
    followed through each other until nothing new is found."""
    nodes = jinja2.nodes
    macros = {m.name: [a.name for a in m.args] for m in tree.find_all(nodes.Macro)}
    aliases = frozenset({"content"})
    while True:
        found = set(aliases)
        for assign in tree.find_all(nodes.Assign):
            if isinstance(assign.target, nodes.Name) and _names_content(assign.node, aliases):
                found.add(assign.target.name)
        for call in tree.find_all(nodes.Call):
            params = macros.get(call.node.name) if isinstance(call.node, nodes.Name) else None
            if not params:
                continue
            for name, arg in zip(params, call.args):
                if _names_content(arg, aliases):
                    found.add(name)
            for kw in call.kwargs:
                if kw.key in params and _names_content(kw.value, aliases):
                    found.add(kw.key)
        if found == aliases:
            return aliases
        aliases = frozenset(found)


class ChatTemplate:
    """One compiled chat template and the special tokens it is rendered with."""

    def __init__(self, source: str, special_tokens: dict[str, str] | None = None, content_format: str = "auto"):
        """``content_format`` (vLLM's ``--chat-template-content-format``): "openai" renders a content list
        as sent (but a tool result's text-only one joined), "string" joins a text-only one into one string
        first, "auto" does what ``content_format`` detects the template reads."""
        if not isinstance(source, str) or not source.strip():
            raise ValueError("the chat template is empty")
        try:
            self._template = _environment().from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ValueError(f"the chat template does not compile: {e}") from None
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self.joins_parts = (content_format == "string"
                            or (content_format == "auto" and self.content_format == "string"))

    def render(self, messages: list[dict], tools: list[dict] | None = None, *, add_generation_prompt: bool = True,
               extra: dict | None = None) -> str:
        """The prompt text for ``messages`` (plain JSON-like dicts)."""
        variables = {**self.special_tokens, **(extra or {})}
        variables.update(messages=[_template_message(m, self.joins_parts) for m in messages], tools=tools,
                         documents=None,
                         add_generation_prompt=add_generation_prompt)
        try:
            return self._template.render(**variables)
        except jinja2.exceptions.TemplateError as e:
            raise TemplateRenderError(f"the chat template cannot render this conversation: {e}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            raise TemplateRenderError(f"the chat template failed on this conversation: {e}") from None

    @cached_property
    def content_format(self) -> str:
        """How this template reads a message's content, as vLLM's ``--chat-template-content-format auto``
        detects it: "openai" when it loops over a content (a list of parts, as Qwen3.5's does; by any name
        the template gives it, ``_content_aliases``), else "string"
        (Qwen3-Next's renders a content that is not a string as nothing: its parts are joined for it)."""
        try:
            tree = _environment().parse(self.source)
        except jinja2.exceptions.TemplateSyntaxError:
            return "openai"
        aliases = _content_aliases(tree)
        loops = tree.find_all(jinja2.nodes.For)
        return "openai" if any(_names_content(loop.iter, aliases) for loop in loops) else "string"

    @cached_property
    def reads_tools(self) -> bool:
        """The template reads the ``tools`` variable (else a request's tools never reach the prompt)."""
        try:
            return "tools" in jinja2.meta.find_undeclared_variables(_environment().parse(self.source))
        except jinja2.exceptions.TemplateSyntaxError:
            return True

    @cached_property
    def takes_late_system(self) -> bool:
        """A system turn between user turns is rendered, not refused nor dropped (probed once)."""
        probe = [{"role": "user", "content": "First."}, {"role": "system", "content": _LATE_SYSTEM_PROBE},
                 {"role": "user", "content": "Second."}]
        try:
            return _LATE_SYSTEM_PROBE in self.render(probe)
        except TemplateRenderError:
            return False
