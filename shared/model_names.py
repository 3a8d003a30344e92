"""The name a served model answers to, computed the same way by engine and gateway."""

from __future__ import annotations

from pathlib import Path

DEMO_MODEL_NAME = "ignis-demo"


def served_name(model_dir: str | None, explicit: str | None = None) -> str:
    """``explicit`` if given; the demo's name when no directory is; else the directory's name."""
    if explicit:
        return explicit
    if not model_dir:
        return DEMO_MODEL_NAME
    return Path(model_dir).resolve().name or str(model_dir)


def model_specs(values, explicit: str | None = None) -> list[tuple[str, str | None]]:
    """``--model`` values (``DIR`` or ``NAME=DIR``, repeatable) as (name, dir) pairs, the default first.

    No value means the built-in demo model (dir None). ``--served-model-name``
    names a single unnamed model. Names must be unique.
    """
    if values is None or values == "":
        values = ()
    if isinstance(values, str):
        values = (values,)
    if not values:
        return [(served_name(None, explicit), None)]
    specs = []
    for v in values:
        if not isinstance(v, str) or not v:
            raise ValueError(f"--model: expected DIR or NAME=DIR, got {v!r}")
        if "=" in v and not v.startswith(("/", ".")):
            name, path = v.split("=", 1)
            if not name or not path:
                raise ValueError(f"--model: expected NAME=DIR, got {v!r}")
        else:
            name, path = served_name(v, explicit if len(values) == 1 else None), v
        specs.append((name, path))
    names = [n for n, _ in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"--model: model names repeat: {names}")
    return specs


def lora_specs(values, model_names=()) -> list[tuple[str, str]]:
    """``--lora-modules`` values (``NAME=PATH``, repeatable) as (name, path) pairs, in order.

    Names are unique and none is a served model's name (``model_names``): a request's ``model`` names
    either a model or an adapter of the default model."""
    if values is None or values == "":
        values = ()
    if isinstance(values, str):
        values = (values,)
    specs = []
    for v in values:
        name, sep, path = v.partition("=") if isinstance(v, str) else ("", "", "")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"--lora-modules: expected NAME=PATH, got {v!r}")
        specs.append((name.strip(), path.strip()))
    names = [n for n, _ in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"--lora-modules: adapter names repeat: {names}")
    taken = sorted(set(names) & set(model_names))
    if taken:
        raise ValueError(f"--lora-modules: {', '.join(taken)} already names a served model")
    return specs
