"""The units' ``ExecStart`` lines as plain argv lists, expanded the way systemd expands them.

``EnvironmentFile`` syntax: ``KEY=VALUE`` lines, ``#`` comments. In a
command line a word that is exactly ``${VAR}`` becomes one word (the
value, empty included) and a word that is exactly ``$VAR`` becomes the
value split at whitespace (no word at all when empty); ``${VAR}`` inside a
longer word is replaced in place. The unit's ``Environment=`` defaults apply
under the env file's values, and ``UnsetEnvironment=`` removes names.
``rewrite`` maps fixed paths of the units (``/usr/local/bin/ignis``,
``/run/ignis``, ``/var/cache/ignis/``) to what a test runs instead.
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


def directives(unit: str, section: str = "Service") -> list[tuple[str, str]]:
    """``unit``'s ``KEY=VALUE`` lines of ``section`` in order, repeated keys kept (configparser keeps the last)."""
    out, current = [], None
    for line in (UNITS / unit).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
        elif current == section:
            key, _, value = line.partition("=")
            out.append((key.strip(), value.strip()))
    return out


def values(unit: str, key: str, section: str = "Service") -> list[str]:
    """Every value ``key`` is given in ``section``, each split at whitespace (Wants=, Environment=, ...)."""
    return [word for k, v in directives(unit, section) if k == key for word in shlex.split(v)]


def unit_environment(unit: str, env_file: dict[str, str]) -> dict[str, str]:
    """The environment systemd gives ``unit``'s process: ``Environment=``, then the env file over it
    (whatever the order of the lines), then ``UnsetEnvironment=`` names removed."""
    env = dict(word.split("=", 1) for word in values(unit, "Environment"))
    env.update(env_file)
    for name in values(unit, "UnsetEnvironment"):
        env.pop(name, None)
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
    """``unit``'s ExecStart under ``env`` (with the unit's own Environment= defaults), each word found in
    ``rewrite`` replaced by its words, and a word under a directory in ``rewrite`` (a key ending in
    ``/``) moved under its replacement."""
    out = []
    for word in expand(exec_start(unit), unit_environment(unit, env)):
        prefix = next((p for p in rewrite if p.endswith("/") and word.startswith(p)), None)
        if prefix is not None:
            out.append(rewrite[prefix][0] + "/" + word[len(prefix):])
        else:
            out += rewrite.get(word, [word])
    return out
