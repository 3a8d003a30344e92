"""``ignis COMMAND``'s argument parsing: no abbreviations, short usage, values named in their errors."""

from __future__ import annotations

import pytest

from ignis.launcher.cli import main


def refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) <= 3  # the error, not every flag the command takes
    return err


@pytest.mark.parametrize("argv, flag", [
    (["serve", "--max-prefill-tokens", "16384"], "--max-prefill-tokens"),  # SGLang's; a prefix of one of ours
    (["serve", "--max-lora", "8"], "--max-lora"),
    (["engine", "--reuse-kv", "1G"], "--reuse-kv"),
])
def test_a_prefix_of_a_flag_is_not_that_flag(argv, flag, capsys):
    assert f"unrecognized arguments: {flag}" in refused(argv, capsys)


@pytest.mark.parametrize("command", ["tierd", "serve"])
def test_a_bad_byte_size_names_the_flag_and_the_value(command, capsys):
    err = refused([command, "--reuse-kv-host-pool-bytes", "-1"], capsys)
    assert "--reuse-kv-host-pool-bytes: not a byte size: '-1'" in err


@pytest.mark.parametrize("command", ["engine", "gateway", "serve"])
def test_an_instance_name_that_is_not_a_file_name_is_refused_naming_the_flag(command, capsys):
    assert main([command, "--instance", "a/b"]) == 2
    assert "--instance: instance name must be" in capsys.readouterr().err


def test_a_demo_model_that_cannot_be_written_is_one_line(tmp_path, capsys):
    target = tmp_path / "file"
    target.mkdir()
    (target / "sub").write_text("")
    assert main(["demo-model", str(target / "sub" / "x")]) == 1
    err = capsys.readouterr().err
    assert "ignis demo-model:" in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_a_malformed_engine_endpoint_is_one_line_naming_the_flag():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "ignis.launcher.cli", "gateway", "--port", "0", "--engine-endpoint",
                          "garbage"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "ignis gateway: --engine-endpoint garbage: cannot connect" in out.stderr
    assert "Traceback" not in out.stderr
