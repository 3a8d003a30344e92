"""A model's recommended sampling: the defaults of fields a request leaves out (vLLM's ``--generation-config``).

A checkpoint's ``generation_config.json`` may carry the sampling its makers
recommend (Qwen3.5 and Qwen3-Next: temperature 0.6, top_p 0.95, top_k 20).
As vLLM does by default, a request that leaves ``temperature``, ``top_p``,
``top_k``, ``min_p``, ``repetition_penalty``, ``presence_penalty`` or
``frequency_penalty`` out gets the model's value
instead of OpenAI's default, and its ``max_new_tokens`` is the default
completion length; a value the request gives always wins.

``--generation-config``: ``auto`` (each model's own file), ``vllm`` (none:
OpenAI's defaults, as before), or a directory holding a
``generation_config.json`` for the default model. ``--override-generation-config``:
a JSON object of the same keys laid over either (every served model).
A checkpoint's value out of its API range is left out with a warning (serving
goes on, the field keeps OpenAI's default); a bad flag stops the gateway at
start, naming it. Other keys of the file (``do_sample``, token ids) are not
sampling defaults.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

from ignis.shared.tokenizer_files import read_json_object

log = logging.getLogger("ignis.gateway")

FILE = "generation_config.json"
SOURCES = ("auto", "vllm")
# key -> (low, high, low end open); top_k and max_new_tokens are integers
RANGES = {
    "temperature": (0.0, 2.0, False),
    "top_p": (0.0, 1.0, True),
    "top_k": (-1, None, False),
    "min_p": (0.0, 1.0, False),
    "repetition_penalty": (0.0, 100.0, True),
    "presence_penalty": (-2.0, 2.0, False),
    "frequency_penalty": (-2.0, 2.0, False),
    "max_new_tokens": (1, None, False),
}
INTEGER_KEYS = ("top_k", "max_new_tokens")
REQUEST_FIELDS = tuple(k for k in RANGES if k != "max_new_tokens")
"""The request fields a model default stands in for when the request leaves them out."""


class GenerationConfigError(ValueError):
    """A ``--generation-config`` or ``--override-generation-config`` the gateway cannot use."""


@dataclass(frozen=True)
class SamplingDefaults:
    """The model's values of ``RANGES``' keys (``top_k`` -1 stored as 0: off)."""

    values: tuple[tuple[str, float | int], ...] = ()
    source: str = ""
    """Where they came from, for the log."""

    def get(self, key: str):
        return dict(self.values).get(key)

    @property
    def max_new_tokens(self) -> int | None:
        return self.get("max_new_tokens")

    def fields(self, omitted: frozenset[str]) -> dict:
        """The request fields in ``omitted`` that the model gives a value for."""
        return {k: v for k, v in self.values if k in omitted}

    def describe(self) -> str:
        return " ".join(f"{k}={v:g}" for k, v in self.values)


def _problem(key: str, value) -> str | None:
    """Why ``value`` cannot be ``key``'s default (None: it can)."""
    lo, hi, lo_open = RANGES[key]
    if key in INTEGER_KEYS:
        if type(value) is not int:
            return f"must be an integer, got {value!r}"
    elif type(value) not in (int, float) or not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    if value < lo or (lo_open and value == lo) or (hi is not None and value > hi):
        top = f"{hi:g}]" if hi is not None else "inf)"
        return f"must be in {'(' if lo_open else '['}{lo:g}, {top}, got {value!r}"
    return None


def _checked(obj: dict, where: str, strict: bool) -> dict:
    """``obj``'s sampling keys whose values fit their ranges; a misfit raises (``strict``) or is warned of."""
    out = {}
    for key in RANGES:
        value = obj.get(key)
        if value is None:
            continue
        problem = _problem(key, value)
        if problem is not None:
            if strict:
                raise GenerationConfigError(f"{where}: {key} {problem}")
            log.warning("%s: %s %s; left out (requests that omit %s get the API's default)", where, key, problem, key)
            continue
        out[key] = max(value, 0) if key == "top_k" else value
    return out


def parse_override(text: str | None) -> dict:
    """``--override-generation-config``'s JSON object of sampling keys (raises naming the flag)."""
    if text is None:
        return {}
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise GenerationConfigError(f"--override-generation-config: not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise GenerationConfigError("--override-generation-config must be a JSON object like '{\"temperature\": 0.7}'")
    unknown = sorted(set(obj) - set(RANGES))
    if unknown:
        raise GenerationConfigError(f"--override-generation-config: unknown key(s) {', '.join(unknown)} "
                                    f"(known: {', '.join(RANGES)})")
    return _checked(obj, "--override-generation-config", strict=True)


def check_source(source: str) -> None:
    """``--generation-config`` is auto, vllm or a directory holding the file."""
    if source in SOURCES:
        return
    if not (Path(source) / FILE).is_file():
        raise GenerationConfigError(f"--generation-config must be auto, vllm or a directory holding {FILE}, "
                                    f"got {source!r}")


def sampling_defaults(source: str, model_config: dict, override: dict, model: str) -> SamplingDefaults:
    """The defaults of ``model``, whose checkpoint's ``generation_config.json`` is ``model_config``:
    from ``source`` (auto: that file; vllm: none; a directory: its file), ``override`` laid over them."""
    if source == "vllm":
        values, where = {}, ""
    elif source == "auto":
        values, where = _checked(model_config, f"{model}'s {FILE}", strict=False), f"{model}'s {FILE}"
    else:
        path = Path(source) / FILE
        try:
            obj = read_json_object(path)
        except ValueError as e:  # names the file
            raise GenerationConfigError(f"--generation-config: {e}") from None
        values, where = _checked(obj, str(path), strict=True), str(path)
    if override:
        values.update(override)
        where = f"{where} and --override-generation-config" if where and values else "--override-generation-config"
    ordered = tuple((k, values[k]) for k in RANGES if k in values)
    return SamplingDefaults(ordered, where if ordered else "")
