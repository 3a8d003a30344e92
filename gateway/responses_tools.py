"""Responses ``tools`` and ``tool_choice`` as the chat path's: function tools, namespaces flattened, hosted left out.

    {"type": "function", "name", "description", "parameters", "strict"}
        -> {"type": "function", "function": {"name", "description", "parameters", "strict"}}
    {"type": "namespace", "name": NS, "tools": [function tools]}
        -> one chat function per inner function, named NS__NAME (``FLAT_JOIN``); a call of NS__NAME
           is answered as a function_call with ``name`` NAME and ``namespace`` NS
    web_search*, file_search, code_interpreter, computer_use*, mcp, image_generation, local_shell,
    custom, ... (anything ignis cannot run)
        -> left out of the prompt and told to the caller (``on_ignored``: it logs and counts them,
           ``ignis:gateway_responses_tools_ignored_total``), never a 400, so an agent that always
           sends them keeps working

``tool_choice``: "auto" / "none" / "required" as in chat; ``{"type": "function",
"name"}`` (with ``namespace`` for a namespaced one) as a named choice;
``{"type": "allowed_tools", "mode", "tools"}`` as chat's ``allowed_tools`` over
its function tools (only hosted ones allowed: "auto"); a hosted tool's choice as
"auto". ``ToolNames`` maps the names the model calls back to the client's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ignis.gateway.fields import Fields

FLAT_JOIN = "__"
NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


@dataclass
class ToolNames:
    """Prompt name -> (namespace or None, the client's name) of every function the prompt offers."""

    names: dict[str, tuple[str | None, str]] = field(default_factory=dict)
    origins: list[str] = field(default_factory=list)
    """The field each chat tool came from (``tools[2].tools[0]``), in chat-tool order."""

    def flat(self, name: str, namespace: str | None) -> str:
        return f"{namespace}{FLAT_JOIN}{name}" if namespace else name

    def client_name(self, prompt_name: str) -> tuple[str | None, str]:
        return self.names.get(prompt_name, (None, prompt_name))


def _function(tf: Fields, namespace: str | None, names: ToolNames) -> dict:
    name = tf.str("name", max_chars=128)
    if not name:
        raise tf.error("name", "is required")
    if not NAME.fullmatch(name):
        raise tf.error("name", "may hold only letters, digits, '_', '.', ':' and '-' (at most 128)")
    flat = names.flat(name, namespace)
    if flat in names.names:
        raise tf.error("name", f"the function {flat!r} is defined twice")
    names.names[flat] = (namespace, name)
    names.origins.append(tf.where)
    fn: dict = {"name": flat}
    description = tf.str("description")
    if description is not None:
        fn["description"] = description
    params = tf.raw("parameters")
    if params is not None and not isinstance(params, dict):
        raise tf.error("parameters", "must be a JSON Schema object")
    fn["parameters"] = params if params is not None else {"type": "object", "properties": {}}
    if tf.has("strict"):
        fn["strict"] = tf.bool("strict")
    return {"type": "function", "function": fn}


def translate_tools(f: Fields, on_ignored) -> tuple[list[dict] | None, ToolNames]:
    """Chat tools of the body's ``tools``; ``on_ignored(kind)`` is told of each hosted tool left out."""
    names = ToolNames()
    tools = f.list("tools")
    if not tools:
        return None, names
    out: list[dict] = []
    for i, tool in enumerate(tools):
        tf = Fields(tool, f"tools[{i}]")
        kind = tf.str("type")
        if kind is None:
            raise tf.error("type", "is required")
        if kind == "function":
            out.append(_function(tf, None, names))
        elif kind == "namespace":
            ns = tf.str("name", max_chars=64)
            if not ns or not NAME.fullmatch(ns):
                raise tf.error("name", "is required: letters, digits, '_', '.', ':' and '-'")
            inner = tf.list("tools", required=True)
            for j, member in enumerate(inner):
                mf = Fields(member, tf.param(f"tools[{j}]"))
                if mf.str("type") == "function":
                    out.append(_function(mf, ns, names))
                else:
                    on_ignored(f"namespace:{mf.str('type')}")
        else:
            on_ignored(kind)
    return out or None, names


def translate_tool_choice(f: Fields, names: ToolNames) -> object:
    """The chat ``tool_choice`` of the body's (None: absent)."""
    value = f.raw("tool_choice")
    if value is None or isinstance(value, str):
        if value not in (None, "auto", "none", "required"):
            raise f.error("tool_choice", "must be 'none', 'auto', 'required' or an object")
        return "auto" if value == "required" and not names.names else value
    cf = Fields(value, "tool_choice")
    kind = cf.str("type")
    if kind == "function":
        name = cf.str("name")
        if not name:
            raise cf.error("name", "is required")
        flat = names.flat(name, cf.str("namespace"))
        if flat not in names.names:
            raise cf.error("name", f"names function {flat!r}, which is not in tools")
        return {"type": "function", "function": {"name": flat}}
    if kind == "allowed_tools":
        mode = cf.str("mode", "auto", choices=("auto", "required"))
        functions = []  # the functions among the allowed tools (hosted ones are left out of the prompt)
        for i, entry in enumerate(cf.list("tools", required=True)):
            ef = Fields(entry, cf.param(f"tools[{i}]"))
            if ef.str("type") != "function":
                continue
            flat = names.flat(ef.str("name") or "", ef.str("namespace"))
            if flat not in names.names:
                raise ef.error("name", f"names function {flat!r}, which is not in tools")
            functions.append({"type": "function", "function": {"name": flat}})
        if not functions:
            return "auto"  # only hosted tools allowed: none of them can run here
        return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": functions}}
    if kind is None:
        raise cf.error("type", "is required")
    return "auto"  # a hosted tool's choice: those tools are left out
