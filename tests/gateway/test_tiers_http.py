"""The lower tiers through HTTP: `ignis serve` with a pool and an arena too small to keep what it retains.

Six conversations with different system prompts, each asked twice: the
device holds about one of them, KV-RAM one more, and the rest spill to
KV-disk. The second round must resume from the tier each landed in, report
cached_tokens and the tier (done line, engine and tierd metrics), and give
exactly the greedy output of the cold round. With KV-disk's default floor
(16,384 tokens on the dense family) the same short prompts are not worth a
disk restore and recompute instead.
"""

from __future__ import annotations

import json
import re
import urllib.request

from tests.gateway.conftest import API_KEY, start_serve, stop_serve
from tests.gateway.test_reuse_http import text

SYSTEMS = [f"You are agent {i}. " + text(200, 10 + i) for i in range(6)]
SMALL = ["--kv-pool-tokens", "1024", "--decode-lanes", "2", "--reuse-host-slots-per-lane", "1",
         "--reuse-kv-host-pool-bytes", "1M", "--kv-disk-bytes", "64M", "--restore-floor-kv-ram", "64",
         "--metrics-port", "0", "--tierd-metrics-port", "0", "--api-key", API_KEY]


def run_rounds(tmp_path, extra):
    from openai import OpenAI

    server = start_serve(tmp_path, SMALL + extra)
    try:
        with OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120) as client:
            def ask(system):
                r = client.chat.completions.create(
                    model=server.model, max_tokens=8, temperature=0,
                    messages=[{"role": "system", "content": system}, {"role": "user", "content": "what next?"}])
                return r.choices[0].message.content, r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens

            cold = [ask(s) for s in SYSTEMS]
            warm = [ask(s) for s in SYSTEMS]
        urls = dict(re.findall(r"^ignis serve: (\w+) metrics on (\S+)$", server.out.read_text(), re.M))
        metrics = {name: urllib.request.urlopen(url, timeout=10).read().decode() for name, url in urls.items()}
    except BaseException:
        print(server.log())
        raise
    finally:
        code = stop_serve(server)
    assert code == 0, server.log()
    done = [json.loads(line[line.index("{"):]) for line in server.err.read_text().splitlines()
            if '"event":"done"' in line]
    return cold, warm, done, metrics


def sample(text_: str, name: str, **labels) -> float:
    total = 0.0
    for line in text_.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_second_round_resumes_from_kv_ram_and_kv_disk_with_the_cold_output(tmp_path):
    cold, warm, done, metrics = run_rounds(tmp_path, ["--restore-floor-kv-disk", "64"])
    assert [c[0] for c in warm] == [c[0] for c in cold]  # greedy: the same tokens as the cold round
    assert all(c[2] == 0 for c in cold)
    assert all(prompt - 8 <= cached < prompt for _text, prompt, cached in warm)  # all but the opener's tail
    assert len(done) == 12
    tiers = [d["tier"] for d in done[6:]]
    assert "kv_disk" in tiers and "kv_ram" in tiers, tiers
    assert [d["cached_tokens"] for d in done[6:]] == [c[2] for c in warm]
    engine, tierd = metrics["engine"], metrics["tierd"]
    for t in ("kv_disk", "kv_ram"):
        assert sample(engine, "ignis:reuse_hits_total", tier=t) == tiers.count(t)
    assert sample(tierd, "ignis:tierd_restores_total", tier="disk") == tiers.count("kv_disk")
    assert sample(tierd, "ignis:tierd_spills_total", kind="retained") >= 1
    assert sample(tierd, "ignis:tierd_copy_gbps", direction="disk_to_engine") > 0


def test_the_default_disk_floor_recomputes_short_prompts_with_the_same_output(tmp_path):
    cold, warm, done, metrics = run_rounds(tmp_path, [])
    assert [c[0] for c in warm] == [c[0] for c in cold]
    tiers = [d["tier"] for d in done[6:]]
    assert "kv_disk" not in tiers and "kv_ram" in tiers, tiers  # 500 tokens are far below 16,384
    assert sample(metrics["tierd"], "ignis:tierd_restores_total", tier="disk") == 0
    assert sum(1 for c in warm if c[2] == 0) == tiers.count("none") >= 1
