"""One ``ignis serve`` per instance: a second one with the same --runtime-dir and --instance is refused
before it starts anything, and the first serves on with its sockets; after a serve killed outright, the
next one's children wait for the old ones to drain instead of taking their sockets over."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from tests.launcher.test_serve import chat, children_of, gone, run_serve, start


def stream_long(url: str, streaming: threading.Event) -> None:
    """A long streamed answer; ``streaming`` is set at its first token."""
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1500, "ignore_eos": True,
                       "stream": True}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            for line in r:
                if line.startswith(b"data: {"):
                    streaming.set()
    except OSError:
        pass  # cut when the old engine gives up draining


def serving_url(tmp_path) -> str:
    return re.search(r"^ignis serving ignis-demo on (\S+)$", (tmp_path / "serve.out").read_text(), re.M).group(1)


@pytest.mark.timeout(240)
def test_a_second_serve_of_the_same_instance_is_refused_and_the_first_serves_on(tmp_path):
    proc, kids = start(tmp_path)
    try:
        sock = tmp_path / "rt" / "default-engine.sock"
        inode = sock.stat().st_ino
        out = run_serve(tmp_path, timeout=60)
        assert out.returncode == 2, out.stderr
        assert f"instance 'default' under {tmp_path / 'rt'} is in use by pid {proc.pid}" in out.stderr
        assert "Traceback" not in out.stderr and "serving" not in out.stdout
        assert sock.stat().st_ino == inode and children_of(proc.pid) == kids
        assert chat(serving_url(tmp_path)).status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


@pytest.mark.timeout(300)
def test_after_serve_is_killed_the_next_ones_children_wait_for_the_old_ones(tmp_path):
    proc, old = start(tmp_path, "--shutdown-timeout", "8")
    again = None
    try:
        url = serving_url(tmp_path)
        assert chat(url).status == 200
        streaming = threading.Event()
        threading.Thread(target=stream_long, args=(url, streaming), daemon=True).start()
        assert streaming.wait(60)  # the old engine drains it (up to its shutdown timeout) after serve is gone
        proc.kill()  # its children get SIGTERM (PR_SET_PDEATHSIG) and drain
        proc.wait(30)
        first = tmp_path / "first"
        first.mkdir()
        for name in ("serve.out", "serve.err"):
            os.replace(tmp_path / name, first / name)
        again, new = start(tmp_path)  # at once: the old children may still hold their sockets
        assert all(gone(k) for k in old) and not set(old) & set(new)
        assert chat(serving_url(tmp_path)).status == 200
        err = (tmp_path / "serve.err").read_text()
        assert f"is in use by pid {old[1]}" in err and "waiting up to 45 s" in err, err[-3000:]  # the old engine
        assert "does not know this engine" not in err, err[-3000:]  # no old engine saying hello to the new tierd
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        if again is not None:
            again.send_signal(signal.SIGTERM)
            assert again.wait(60) == 0
