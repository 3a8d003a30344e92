"""docs/operations.md names every flag of every process, so it cannot fall behind the code."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ignis.engine.config import EngineConfig
from ignis.gateway.config import GatewayConfig
from ignis.launcher.serve import ServeConfig
from ignis.tierd.config import TierdConfig

DOC = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()


@pytest.mark.parametrize("cfg", [EngineConfig, GatewayConfig, TierdConfig, ServeConfig])
def test_every_flag_is_documented(cfg):
    for f in dataclasses.fields(cfg):
        if f.metadata.get("cli") is False:
            continue
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        assert f"`{flag}`" in DOC, f"{cfg.__name__}: {flag} is missing from docs/operations.md"
