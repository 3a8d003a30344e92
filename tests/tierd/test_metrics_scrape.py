"""tierd's metrics endpoint, parsed with prometheus_client: arena gauges, and counters that move."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

import zmq
from prometheus_client.parser import text_string_to_metric_families


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels
            or set(s.labels) <= {"instance", "socket"}}


def test_arena_gauges_and_wire_error_counter(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "ignis.launcher.cli", "tierd", "--runtime-dir", str(tmp_path / "rt"),
                             "--reuse-kv-host-pool-bytes", "4M", "--metrics-port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        port = endpoint = None
        deadline = time.monotonic() + 30
        while endpoint is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("METRICS "):
                port = int(line.split()[1])
            elif line.startswith("READY "):
                endpoint = line.split()[1]
        assert port and endpoint
        before = scrape(port)
        assert before["ignis:tierd_arena_bytes"] == 4 << 20
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        sock.send_multipart([b"not a message"])
        assert sock.poll(5000)
        sock.recv_multipart()
        sock.close()
        key = "ignis:tierd_wire_errors_total"
        deadline = time.monotonic() + 10  # tierd folds its channel's count into the metrics between messages
        while scrape(port).get(key, 0) - before.get(key, 0) < 1:
            assert time.monotonic() < deadline, scrape(port)
            time.sleep(0.1)
        assert scrape(port)[key] - before.get(key, 0) == 1
    finally:
        proc.terminate()
        assert proc.wait(20) == 0
