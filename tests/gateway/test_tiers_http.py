"""The lower tiers through HTTP: `ignis serve` with a pool and an arena too small to keep what it retains.

Six conversations with different system prompts, each asked twice: the
device holds about one of them, KV-RAM one more, and the rest spill to
KV-disk. The second round must resume from the tier each landed in, report
cached_tokens and the tier (done line, engine and tierd metrics), and give
exactly the greedy output of the cold round. With KV-disk's default floor
(16,384 tokens on the dense family) the same short prompts are not worth a
disk restore and recompute instead. With reuse off, tierd still takes the
live sequences an interactive burst evicts, and they finish with the
tokens of an undisturbed run.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import re
import time
import urllib.request

from tests.gateway.conftest import API_KEY, start_serve, stop_serve
from tests.gateway.test_reuse_http import text

SYSTEMS = [f"You are agent {i}. " + text(200, 10 + i) for i in range(6)]
SMALL = ["--kv-pool-tokens", "1024", "--decode-lanes", "2", "--reuse-host-slots-per-lane", "1",
         "--reuse-kv-host-pool-bytes", "1M", "--kv-disk-bytes", "64M", "--restore-floor-kv-ram", "64",
         "--metrics-port", "0", "--tierd-metrics-port", "0", "--api-key", API_KEY]


@contextlib.contextmanager
def serving(tmp_path, argv):
    """``ignis serve`` for one test: its log printed if the test fails, stopped with exit code 0 after."""
    server = start_serve(tmp_path, argv)
    try:
        yield server
    except BaseException:
        print(server.log())
        stop_serve(server)
        raise
    code = stop_serve(server)
    assert code == 0, server.log()


def scrape_metrics(server) -> dict[str, str]:
    """Each child's /metrics text, by the names serve printed (``engine``, ``tierd``)."""
    urls = dict(re.findall(r"^ignis serve: (\w+) metrics on (\S+)$", server.out.read_text(), re.M))
    return {name: urllib.request.urlopen(url, timeout=10).read().decode() for name, url in urls.items()}


def wait_until_decoding(server, running: int, generated: float, timeout: float = 120) -> None:
    """Poll the engine's metrics until ``running`` requests hold lanes and ``generated`` tokens were made."""
    deadline = time.monotonic() + timeout
    while True:
        engine = scrape_metrics(server)["engine"]
        if (sample(engine, "ignis:num_requests_running") >= running
                and sample(engine, "ignis:generation_tokens_total") >= generated):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the agents did not reach decoding in {timeout} s:\n{engine}")
        time.sleep(0.05)  # a poll interval, not a wait for a state


def run_rounds(tmp_path, extra):
    from openai import OpenAI

    with serving(tmp_path, SMALL + extra) as server:
        with OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120) as client:
            def ask(system):
                r = client.chat.completions.create(
                    model=server.model, max_tokens=8, temperature=0, logprobs=True,
                    messages=[{"role": "system", "content": system}, {"role": "user", "content": "what next?"}])
                logprobs = [t.logprob for t in r.choices[0].logprobs.content]
                return (r.choices[0].message.content, r.usage.prompt_tokens,
                        r.usage.prompt_tokens_details.cached_tokens, logprobs)

            cold = [ask(s) for s in SYSTEMS]
            warm = [ask(s) for s in SYSTEMS]
        metrics = scrape_metrics(server)
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
    assert all(prompt - 8 <= cached < prompt for _text, prompt, cached, _lp in warm)  # all but the opener's tail
    for c, w in zip(cold, warm):  # the resumed logits are the cold ones (up to the chunking's last bits)
        assert max(abs(a - b) for a, b in zip(c[3], w[3])) < 1e-3
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
    # each says why: its match sits on KV-disk, short of the floor
    assert {d["shortfall"] for d in done[6:] if d["tier"] == "none"} == {"below_floor"}, done[6:]


def test_with_reuse_off_live_agents_are_evicted_to_tierd_and_resume_exactly(tmp_path):
    from openai import OpenAI

    argv = ["--kv-pool-tokens", "3584", "--decode-lanes", "5", "--reuse-prompt", "off", "--evict-window-pages", "2",
            "--metrics-port", "0", "--tierd-metrics-port", "0", "--api-key", API_KEY]
    agents = [f"Agent {i}. " + text(120, 50 + i) for i in range(4)]
    with serving(tmp_path, argv) as server:
        with OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300) as client:
            def ask(system, request_class, max_tokens, seed=None):
                sampling = {"temperature": 0.9, "seed": seed} if seed is not None else {"temperature": 0}
                r = client.chat.completions.create(
                    model=server.model, max_tokens=max_tokens, **sampling,
                    messages=[{"role": "system", "content": system}, {"role": "user", "content": "go"}],
                    extra_body={"request_class": request_class, "ignore_eos": True})
                return r.choices[0].message.content

            seeds = [None, 1, None, 3]  # greedy and seeded sampling
            # The burst comes once each agent made about 32 tokens: with 240 it still has about 200 to make
            # after the interactive request that found no lane evicted it, most of them after its resume.
            with concurrent.futures.ThreadPoolExecutor(6) as pool:
                alone = list(pool.map(lambda i: ask(agents[i], "agent", 240, seeds[i]), range(4)))
                generated = sample(scrape_metrics(server)["engine"], "ignis:generation_tokens_total")
                runs = [pool.submit(ask, agents[i], "agent", 240, seeds[i]) for i in range(4)]
                wait_until_decoding(server, running=4, generated=generated + 4 * 32)
                burst = [pool.submit(ask, "Interactive. " + text(400, 90 + j), "interactive", 8) for j in range(2)]
                [f.result(timeout=240) for f in burst]
                disturbed = [f.result(timeout=240) for f in runs]
        metrics = scrape_metrics(server)
    engine, tierd = metrics["engine"], metrics["tierd"]
    assert disturbed == alone
    assert sample(engine, "ignis:live_evictions_total") >= 1
    assert sample(tierd, "ignis:tierd_demotions_total", kind="live") >= 1
    assert sample(tierd, "ignis:tierd_restores_total", kind="live") >= 1
    assert sample(engine, "ignis:reuse_hits_total") == 0
    # the evicted agents' done lines say they resumed live; nothing was recomputed
    done = [json.loads(line[line.index("{"):]) for line in server.err.read_text().splitlines()
            if '"event":"done"' in line]
    resumed = [d["preempted"] for d in done if "preempted" in d]
    assert sum(p["resumed_live"] for p in resumed) == sample(engine, "ignis:live_resumes_total") >= 1
    assert sum(p["evicted_live"] for p in resumed) == sample(engine, "ignis:live_evictions_total")
    assert all(p["recomputed"] == 0 for p in resumed)
