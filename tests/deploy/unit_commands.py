"""The units' ``ExecStart`` lines as plain argv lists, expanded the way systemd expands them.

``EnvironmentFile`` syntax: ``KEY=VALUE`` lines, ``#`` comments. In a
command line a word that is exactly ``${VAR}`` becomes one word (the
value, empty included) and a word that is exactly ``$VAR`` becomes the
value split at whitespace (no word at all when empty); ``${VAR}`` inside a
longer word is replaced in place. ``rewrite`` maps fixed paths of the units
(``/usr/local/bin/ignis``, ``/run/ignis``) to what a test runs instead.
"""

from __future__ import annotations

import configparser
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
ENV_EXAMPLE = ROOT / "deploy" / "ignis.env.example"


def read_env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}: not KEY=VALUE: {line!r}")
        env[key.strip()] = value.strip()
    return env


def exec_start(unit: str) -> str:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str
    cp.read(UNITS / unit)
    return cp["Service"]["ExecStart"]


def expand(line: str, env: dict[str, str]) -> list[str]:
    argv = []
    for word in shlex.split(line):
        if m := re.fullmatch(r"\$\{(\w+)\}", word):
            argv.append(env.get(m.group(1), ""))
        elif m := re.fullmatch(r"\$(\w+)", word):
            argv += env.get(m.group(1), "").split()
        else:
            argv.append(re.sub(r"\$\{(\w+)\}", lambda v: env.get(v.group(1), ""), word))
    return argv


def unit_argv(unit: str, env: dict[str, str], rewrite: dict[str, list[str]]) -> list[str]:
    """``unit``'s ExecStart under ``env``, each word found in ``rewrite`` replaced by its words."""
    out = []
    for word in expand(exec_start(unit), env):
        out += rewrite.get(word, [word])
    return out
