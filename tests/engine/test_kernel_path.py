"""The kernel path at load: --allow-torch-fallback, the refusal's exit, the path named from the stats
(tests/engine/test_engine_metrics.py scrapes its gauge)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from ignis.engine import cli
from ignis.engine.config import EngineConfig
from ignis.engine.engine_stats import kernel_path
from ignis.kernels.backend import TRITON_FORMS, KernelPathError
from ignis.shared.flags import add_flags, from_args


def parse(*argv: str) -> EngineConfig:
    parser = argparse.ArgumentParser()
    add_flags(parser, EngineConfig)
    return from_args(EngineConfig, parser.parse_args(list(argv)))


def test_allow_torch_fallback_flag():
    assert parse().allow_torch_fallback is False
    assert parse("--allow-torch-fallback").allow_torch_fallback is True
    assert parse("--allow-torch-fallback", "on").allow_torch_fallback is True
    assert parse("--allow-torch-fallback", "off").allow_torch_fallback is False
    assert parse("--allow-torch-fallback", "--device", "cpu").allow_torch_fallback is True
    assert parse("--reuse-prompt", "off").reuse_prompt is False  # other booleans still take on/off


def test_refusal_exits_2_with_the_message(monkeypatch, capsys):
    def refuse(config):
        raise KernelPathError("kernel path mixed: 1 of 11 ops run on their torch twins because ...: "
                              "hq_prefill_attention (ModuleNotFoundError: boom)")

    monkeypatch.setattr(cli, "build_server", refuse)
    monkeypatch.setattr(cli, "setup_logging", lambda name: None)  # leave this process's logging alone
    assert cli.run(argparse.Namespace(device="cuda")) == 2
    err = capsys.readouterr().err
    assert err.startswith("ignis engine: kernel path mixed") and "hq_prefill_attention" in err, err


def test_engine_on_cuda_without_triton_refuses_to_start(tmp_path):
    """``ignis engine`` where the device is CUDA and triton cannot be imported: a one-line error naming
    the ops and the import error, exit code 2, no traceback (the device is faked: the check comes
    before anything touches it)."""
    code = ("import sys; sys.modules['triton'] = None; import ignis.engine.load_choices as lc; "
            "lc.resolve_device = lambda choice: 'cuda'; "
            "from ignis.launcher.cli import main; sys.exit(main(sys.argv[1:]))")
    out = subprocess.run([sys.executable, "-c", code, "engine", "--runtime-dir", str(tmp_path / "rt")],
                         capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "IGNIS_KERNELS"})
    assert out.returncode == 2, out.stderr
    every = len(TRITON_FORMS)
    assert f"ignis engine: kernel path reference: {every} of {every} ops" in out.stderr
    assert "hq_decode_attention" in out.stderr and "triton" in out.stderr
    assert "--allow-torch-fallback" in out.stderr and "Traceback" not in out.stderr


def test_kernel_path_from_stats():
    assert kernel_path({"kernel_triton_ops": 11, "kernel_twin_ops": 0, "kernel_fallback_ops": 0}) == "triton"
    assert kernel_path({"kernel_triton_ops": 10, "kernel_twin_ops": 1, "kernel_fallback_ops": 1}) == "mixed"
    assert kernel_path({"kernel_triton_ops": 0, "kernel_twin_ops": 11, "kernel_fallback_ops": 0}) == "reference"
