"""Codex CLI (`codex exec`, from the npm registry) runs one turn against the gateway's /v1/responses.

It downloads Codex from the npm registry, so it runs only in the long mode
(``IGNIS_LONG_TESTS=1``: the default suite fetches nothing), and is skipped
when ``node``/``npm`` are absent or the package cannot be installed
(no network). The package is installed once into a cache directory
(``$XDG_CACHE_HOME/ignis-tests``, else ``~/.cache/ignis-tests``) and reused.
The gateway runs on the official Qwen3.5 template in front of the scripted
engine, which answers every request (Codex sends no seed) with a fixed text,
so the turn ends cleanly and what is tested is the wire: Codex's request body
through the chat path, and our events through Codex.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.gateway import fake_engine

pytestmark = [pytest.mark.long,
              pytest.mark.skipif(os.environ.get("IGNIS_LONG_TESTS") != "1",
                                 reason="long mode: IGNIS_LONG_TESTS=1 (downloads Codex from npm)")]
from tests.gateway.tools_http_support import tools_gateway

CODEX_VERSION = "0.171.0"
ANSWER = "Hello from ignis."


def codex_binary() -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node / npm are not installed")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ignis-tests" / f"codex-{CODEX_VERSION}"
    binary = cache / "node_modules" / ".bin" / "codex"
    if not binary.exists():
        cache.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(cache),
                               f"@openai/codex@{CODEX_VERSION}"], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 or not binary.exists():
            pytest.skip(f"cannot install @openai/codex: {proc.stderr[-500:]}")
    return binary


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    big = pytest.MonkeyPatch()
    big.setattr(fake_engine, "MAX_MODEL_LEN", 262_144)  # Codex's instructions and tools run to ~10k tokens
    try:
        yield from tools_gateway(tmp_path_factory, "qwen3_5")
    finally:
        big.undo()


def answers(gw, *texts: str) -> None:
    """The engine's answers to the next requests, in order."""
    for t in texts:
        gw.engine.queue(gw.tokenizer.encode(t) + [gw.tokenizer.token_id("<|im_end|>")])


def codex_exec(gw, tmp_path, prompt: str, *flags: str) -> subprocess.CompletedProcess:
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(
        f'model = "{gw.model}"\nmodel_provider = "ignis"\n\n[model_providers.ignis]\nname = "ignis"\n'
        f'base_url = "{gw.url}/v1"\nwire_api = "responses"\nenv_key = "IGNIS_TEST_KEY"\n')
    proc = subprocess.run([str(codex_binary()), "exec", "--skip-git-repo-check", *flags, prompt], cwd=work,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, CODEX_HOME=str(home), IGNIS_TEST_KEY="unused"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_codex_exec_runs_a_turn_to_its_end(gw, tmp_path):
    codex_binary()
    answers(gw, ANSWER)
    proc = codex_exec(gw, tmp_path, "Say hello.")
    assert ANSWER in proc.stdout + proc.stderr
    prompt = gw.last_prompt()
    assert "Say hello." in prompt and "<tools>" in prompt  # Codex's tools reached the template
    assert prompt.startswith("<|im_start|>system\n")


def test_codex_runs_a_tool_and_sends_the_reasoning_back(gw, tmp_path):
    """Turn one: reasoning and an exec_command call; Codex runs it and sends back the call, its output and
    the reasoning item (its sealed blob, as Codex keeps no server state): turn two's prompt has the
    reasoning restored where the template keeps it, and the answer ends the turn."""
    codex_binary()
    call = ("<tool_call>\n<function=exec_command>\n<parameter=cmd>\necho ignis-$((6*7))\n</parameter>\n"
            "</function>\n</tool_call>")
    answers(gw, "List nothing, just echo.\n</think>\n\n" + call, "Checked.\n</think>\n\n" + ANSWER)
    first = len(gw.engine.generates)
    proc = codex_exec(gw, tmp_path, "Run the echo.", "-c", 'model_reasoning_effort="high"')
    assert ANSWER in proc.stdout + proc.stderr
    prompts = [gw.tokenizer.decode(list(g.prompt_ids), skip_special_tokens=False)
               for g in gw.engine.generates[first:]]
    assert len(prompts) == 2 and prompts[0].endswith("<|im_start|>assistant\n<think>\n")
    assert ("<|im_start|>assistant\n<think>\nList nothing, just echo.\n</think>\n\n<tool_call>\n"
            "<function=exec_command>") in prompts[1]
    assert "<tool_response>" in prompts[1] and "ignis-42" in prompts[1]
