"""The gateway imports neither torch nor transformers, even once its app is built and serving."""

from __future__ import annotations

import subprocess
import sys

CODE = r"""
import asyncio, pkgutil, importlib, sys
import ignis.gateway
for mod in pkgutil.iter_modules(ignis.gateway.__path__):
    importlib.import_module("ignis.gateway." + mod.name)
from ignis.shared.demo import ensure_demo_model
from ignis.gateway.app import build_app
from ignis.gateway.config import GatewayConfig
from ignis.gateway.tokenizer import load_model_files

async def main():
    app = build_app(GatewayConfig(), load_model_files(ensure_demo_model()), "ignis-demo", "ipc:///tmp/nothing.sock")
    from aiohttp import web
    runner = web.AppRunner(app)
    await runner.setup()
    await runner.cleanup()

asyncio.run(main())
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))
print("LOADED", bad)
"""


def test_gateway_imports_no_torch():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "LOADED []" in out.stdout, out.stdout
