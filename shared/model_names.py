"""The name a served model answers to, computed the same way by engine and gateway (and where its files are:
a Hugging Face repo id is its cached snapshot, ``shared.hf_cache``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ignis.shared.hf_cache import resolve_checkpoint
from ignis.shared.wire import MAX_ID_CHARS

DEMO_MODEL_NAME = "ignis-demo"
LORA_MODULES_HELP = (
    "a LoRA adapter served with the default model, as NAME=PATH or vLLM's JSON form {\"name\": ..., "
    "\"path\": ...} (a PEFT directory: adapter_config.json and adapter_model.safetensors); repeat for more. "
    "A request whose model is NAME runs the default model with that adapter (vLLM's flag)")
LORA_UPDATING_HELP = (
    "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's): LoRA adapters loaded and "
    "unloaded while serving; off by default, as it lets API clients make the engine read a directory")
"""The help of the two flags the engine and the gateway share (``ignis serve`` hands each to both)."""
DOWNLOAD_DIR_HELP = (
    "the Hugging Face hub cache where --model and --lora-modules repo ids are looked up (vLLM's flag; nothing is "
    "downloaded); default: $HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub")
SERVED_NAME_HELP = (
    "the model name clients ask for (default: the checkpoint directory's name; 'ignis-demo' for the demo); "
    "several names (vLLM's --served-model-name A B, or the flag repeated) all answer, the first is the one "
    "answers carry")


def check_name(name: str, flag: str) -> str:
    """``name`` as a model name requests carry (the wire's id bounds): not empty, at most ``MAX_ID_CHARS``
    characters, no control characters; else a ValueError naming ``flag``."""
    if not name or not name.strip():
        raise ValueError(f"{flag}: a model name must not be empty")
    if len(name) > MAX_ID_CHARS:
        raise ValueError(f"{flag}: the model name is {len(name)} characters, at most {MAX_ID_CHARS} allowed")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ValueError(f"{flag}: the model name {name!r} holds a control character")
    return name


def served_names(explicit) -> tuple[str, ...]:
    """``--served-model-name``'s values (one string, several, or none) as a tuple."""
    if explicit is None or explicit == () or explicit == []:
        return ()
    names = (explicit,) if isinstance(explicit, str) else tuple(explicit)
    return tuple(check_name(n, "--served-model-name") for n in names)


def served_name(model_dir: str | None, explicit=None) -> str:
    """``explicit``'s first name if given; the demo's name when no directory is; else the directory's name as
    given (a symlink's own: ``/models/current`` answers to "current" whichever release it points at)."""
    if served_names(explicit):
        return served_names(explicit)[0]
    if not model_dir:
        return DEMO_MODEL_NAME
    return Path(os.path.abspath(model_dir)).name or str(model_dir)


def model_specs(values, explicit=None) -> list[tuple[str, str | None]]:
    """``--model`` values (``DIR`` or ``NAME=DIR``, repeatable) as (name, dir) pairs, the default first.

    No value means the built-in demo model (dir None). ``--served-model-name``
    names a single unnamed model (its first name; ``model_aliases`` are the
    others). A DIR that is a Hugging Face repo id (``shared.hf_cache``) is its
    cached snapshot, named by the repo id. Names must be unique.
    """
    if values is None or values == "":
        values = ()
    if isinstance(values, str):
        values = (values,)
    if not values:
        return [(served_name(None, explicit), None)]
    if len(values) > 1 and served_names(explicit):
        raise ValueError("--served-model-name names a single model; with several, name each as --model NAME=DIR")
    specs = []
    for v in values:
        if not isinstance(v, str) or not v:
            raise ValueError(f"--model: expected DIR or NAME=DIR, got {v!r}")
        if "=" in v and not v.startswith(("/", ".")):
            name, path = v.split("=", 1)
            if not name or not path:
                raise ValueError(f"--model: expected NAME=DIR, got {v!r}")
            check_name(name, "--model")
            path, _ = resolve_checkpoint(path, "--model")
        else:
            path, cached = resolve_checkpoint(v, "--model")  # a repo id answers to itself, as vLLM's
            mine = explicit if len(values) == 1 else None
            name = served_name(path, mine) if not cached or served_names(mine) else v
        specs.append((name, path))
    names = [n for n, _ in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"--model: model names repeat: {names}")
    return specs


def model_aliases(values, explicit=None) -> tuple[str, ...]:
    """The further ``--served-model-name`` names of the one model they name (several models are named by
    ``--model NAME=DIR`` instead: ``model_specs`` refuses the flag with them); without the flag, a
    directory given through a symlink also answers to its target's name."""
    specs = model_specs(values, explicit)
    names = served_names(explicit)
    if len(specs) == 1 and not names and specs[0][1] is not None:
        # a directory reached through a symlink answers to the link's name, and to its target's as before
        # (a cached repo id answers to itself only: its snapshot's directory name is a commit hash)
        name, path = specs[0]
        target = Path(path).resolve().name
        named_by_dir = name == served_name(path)
        return (target,) if named_by_dir and target and target != name else ()
    if len(specs) != 1 or not names or specs[0][0] != names[0]:
        return ()
    extra = names[1:]
    if len(set(names)) != len(names):
        raise ValueError(f"--served-model-name: names repeat: {list(names)}")
    return extra


def lora_specs(values, model_names=()) -> list[tuple[str, str]]:
    """``--lora-modules`` values (``NAME=PATH``, or vLLM's JSON form ``{"name": ..., "path": ...}``;
    repeatable) as (name, path) pairs, in order.

    Names are unique and none is a served model's name (``model_names``): a request's ``model`` names
    either a model or an adapter of the default model."""
    if values is None or values == "":
        values = ()
    if isinstance(values, str):
        values = (values,)
    specs = []
    for v in values:
        name, path = _lora_spec(v)
        specs.append((name, path))
    names = [n for n, _ in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"--lora-modules: adapter names repeat: {names}")
    taken = sorted(set(names) & set(model_names))
    if taken:
        raise ValueError(f"--lora-modules: {', '.join(taken)} already names a served model")
    return specs


def _lora_spec(value) -> tuple[str, str]:
    """One ``--lora-modules`` value as (name, path)."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            obj = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--lora-modules: not valid JSON ({exc}): {value!r}") from None
        name, path = (obj.get("name"), obj.get("path")) if isinstance(obj, dict) else (None, None)
        if not isinstance(name, str) or not isinstance(path, str) or not name.strip() or not path.strip():
            raise ValueError(f'--lora-modules: the JSON form needs "name" and "path" strings, got {value!r}')
        return name.strip(), resolve_checkpoint(path.strip(), "--lora-modules")[0]
    name, sep, path = value.partition("=") if isinstance(value, str) else ("", "", "")
    if not sep or not name.strip() or not path.strip():
        raise ValueError(f"--lora-modules: expected NAME=PATH or {{\"name\": ..., \"path\": ...}}, got {value!r}")
    return name.strip(), resolve_checkpoint(path.strip(), "--lora-modules")[0]
