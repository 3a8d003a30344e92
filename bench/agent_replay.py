"""Replay a recorded agent session against ignis and compare what it reused with what it could have.

    python bench/agent_replay.py [--trace FILE] [--template official|demo] [--model DIR] [--quick]
    python bench/agent_replay.py --url URL [--cold-url URL] [--learned-off-url URL] [--api-key KEY]

By default it starts its own servers (``ignis serve``) on a tiny random
Qwen3.5 checkpoint with the real tokenizer and the official chat template
(``--template demo``: the demo model's template instead): reuse on, reuse off
(the cold reference for every output) and, for the short-prompt tax, reuse on
with ``--reuse-learned-points off``. With ``--url`` it replays against a
server already running; the reference and tax columns then need
``--cold-url`` and ``--learned-off-url`` (else they read n/a).

Each request of the trace is sent in order (``--concurrency N``: up to N at
once; ``--timed``: at its recorded time), streamed, greedy, ``max_tokens``
capped (``--max-tokens``). Per request it prints the prompt tokens, the
cached tokens, the ideal (the longest prefix, in whole 64-token pages, that
the prompt shares with any earlier prompt of the replay, from the server's
own tokenization via ``return_token_ids``), the time to first token and
whether the output equals the reuse-off server's.

Last line: ``BENCH agent_replay trace=NAME cached_vs_ideal=A
warm_ttft_vs_cold=B outputs_equal=C short_tax=D``: A the lowest cached/ideal
over the requests with an ideal (goal >= 0.95), B their summed TTFT with
reuse on over reuse off, C the fraction of outputs equal to reuse off (goal
1), D the median TTFT of cold 1K-token prompts with learned points on over
off (goal <= 1.05). ``--quick``: the first two runs with every long text cut
to an eighth and two tools (the same shape, about a tenth of the tokens),
fewer tax trials, measured on the reuse-on server that replayed (three
servers, not four). Each pair of servers (the trio with ``--quick``) starts
at once. ``--model DIR``: serve that checkpoint (either family, with its
own tokenizer, and its own template unless ``--template demo``) instead of
building the tiny one. The ideal is in whole pages and a resume may end
inside one (a prompt checkpoint, a part boundary), so A can pass 1 a little.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from checkout import use_checkout  # noqa: E402

use_checkout()

from tests.support.replay import QWEN_CODE_TRACE, ideals, load_trace, replay, send, shrink  # noqa: E402

API_KEY = "bench-key"
WORDS = ("alpha beta gamma delta search file read write patch build test deploy query index vector shard "
         "lane page slot token model prompt cache tier disk arena window").split()


def start_server(stack: ExitStack, model_dir: Path, *extra: str) -> str:
    """``ignis serve`` on ``model_dir``, stopped when ``stack`` closes; returns its URL."""
    from tests.gateway.conftest import start_serve, stop_serve

    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ignis-replay-")))
    server = start_serve(tmp, ["--model", str(model_dir), "--served-model-name", "replay", "--api-key", API_KEY,
                               "--kv-pool-tokens", "131072", "--decode-lanes", "4",
                               "--reuse-host-slots-per-lane", "4", *extra])
    stack.callback(stop_serve, server)
    return server.url


def start_servers(stack: ExitStack, model_dir: Path, *variants: tuple[str, ...]) -> list[str]:
    """``start_server`` with each variant's extra flags, all started at once; their URLs in that order."""
    with ThreadPoolExecutor(len(variants)) as pool:
        started = [pool.submit(start_server, stack, model_dir, *extra) for extra in variants]
    return [f.result() for f in started]


def build_checkpoint(stack: ExitStack, template: str, model: str | None = None) -> Path:
    """The directory to serve: ``model`` itself under the official ``template`` (its own), else a temporary
    one (a copy of ``model``, or a new tiny random qwen3_5 checkpoint with the real tokenizer and the official
    template) that the demo ``template`` then rewrites."""
    if model is not None and template == "official":
        return Path(model)
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ignis-replay-ckpt-")))
    if model is not None:
        import shutil

        path = Path(shutil.copytree(model, tmp / Path(model).name))
    else:
        from tests.support.real_tokenizer import make_real_checkpoint

        path = make_real_checkpoint(tmp, "qwen3_5").path
    if template == "demo":
        from ignis.shared.demo import ensure_demo_model
        from ignis.shared.tokenizer_files import read_tokenizer_files

        (path / "chat_template.jinja").write_text(read_tokenizer_files(ensure_demo_model()).chat_template)
    return path


def model_id(url: str, api_key: str) -> str:
    import json
    import urllib.request

    req = urllib.request.Request(url.rstrip("/") + "/v1/models", headers={"Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())["data"][0]["id"]


def cold_prompt_ttft(url: str, api_key: str, model: str, seed: int) -> float:
    """TTFT of a chat prompt of about 1K tokens that no earlier prompt shares."""
    rng = random.Random(seed)
    text = f"Case {seed}. " + " ".join(rng.choice(WORDS) for _ in range(1000))
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 1, "temperature": 0,
            "stream": True, "return_token_ids": True}
    return send(url, api_key, "/v1/chat/completions", body).ttft_ms


def short_tax(on: str, off: str, api_key: str, trials: int) -> float:
    """Median cold 1K-token TTFT on ``on`` over ``off``, trials interleaved."""
    model_on, model_off = model_id(on, api_key), model_id(off, api_key)
    for url, model in ((on, model_on), (off, model_off)):
        cold_prompt_ttft(url, api_key, model, seed=10_000)  # warm-up
    a, b = [], []
    for i in range(trials):
        a.append(cold_prompt_ttft(on, api_key, model_on, seed=2 * i + 1))
        b.append(cold_prompt_ttft(off, api_key, model_off, seed=2 * i + 2))
    return statistics.median(a) / statistics.median(b)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(QWEN_CODE_TRACE), help="JSON-lines trace (default: the Qwen Code one)")
    ap.add_argument("--url", help="replay against this server instead of starting one")
    ap.add_argument("--cold-url", help="with --url: a reuse-off server of the same model, for the outputs")
    ap.add_argument("--learned-off-url", help="with --url: the same server with --reuse-learned-points off")
    ap.add_argument("--api-key", default=API_KEY)
    ap.add_argument("--template", choices=("official", "demo"), default="official")
    ap.add_argument("--model", help="serve this checkpoint (either family, with its own tokenizer, and its own "
                                    "template unless --template demo) instead of building the tiny one")
    ap.add_argument("--max-tokens", type=int, default=8, help="cap on each request's max_tokens")
    ap.add_argument("--concurrency", type=int, default=1, help="requests in flight at once (in trace order)")
    ap.add_argument("--timed", action="store_true", help="send each request at its recorded time 't' (a trace "
                                                         "that records them; the recorded concurrency)")
    ap.add_argument("--tax-trials", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="the first two runs, shrunk; fewer tax trials")
    args = ap.parse_args(argv)
    key = args.api_key if args.url else API_KEY
    trace = load_trace(args.trace)
    if args.timed and any(r.t is None for r in trace):  # before any server starts
        ap.error(f"--timed: {args.trace} records no time 't' on some requests (the Qwen Code trace has none)")
    if args.quick:
        trace = shrink([r for r in trace if r.run < 2], factor=8, max_tools=2)
        args.tax_trials = 3

    def run(url: str | None):
        return replay(trace, url, key, model_id(url, key), args.max_tokens, args.concurrency, args.timed) \
            if url else None

    if args.url:
        got, ref = run(args.url), run(args.cold_url)
        tax = short_tax(args.url, args.learned_off_url, key, args.tax_trials) if args.learned_off_url \
            else float("nan")
        return report(Path(args.trace).stem, trace, got, ref, tax)
    cold, learned_off = ("--reuse-prompt", "off"), ("--reuse-learned-points", "off")
    with ExitStack() as outer:
        model_dir = build_checkpoint(outer, args.template, args.model)
        if args.quick:  # the tax on the reuse-on server that replayed: three servers, not four
            with ExitStack() as servers:
                on, off, tax_off = start_servers(servers, model_dir, (), cold, learned_off)
                got, ref = run(on), run(off)
                tax = short_tax(on, tax_off, key, args.tax_trials)
            return report(Path(args.trace).stem, trace, got, ref, tax)
        with ExitStack() as servers:  # one pair of servers at a time on a small machine
            on, off = start_servers(servers, model_dir, (), cold)
            got, ref = run(on), run(off)
        with ExitStack() as servers:
            on, tax_off = start_servers(servers, model_dir, (), learned_off)
            tax = short_tax(on, tax_off, key, args.tax_trials)
    return report(Path(args.trace).stem, trace, got, ref, tax)


def report(name: str, trace, got, ref, tax: float) -> int:
    ideal = ideals([r.prompt_ids for r in got])
    print(f"{'seq':>4}{'run':>4}{'prompt':>8}{'cached':>8}{'ideal':>8}{'ttft_ms':>10}{'cold_ms':>10}  equal")
    ratios, warm, cold_ms, equal = [], 0.0, 0.0, []
    for i, (r, g) in enumerate(zip(trace, got)):
        c = ref[i] if ref else None
        same = None if c is None else g.output_ids == c.output_ids
        equal.append(same)
        if ideal[i]:
            ratios.append(g.cached_tokens / ideal[i])
            if c is not None:
                warm, cold_ms = warm + g.ttft_ms, cold_ms + c.ttft_ms
        print(f"{r.seq:>4}{r.run:>4}{g.prompt_tokens:>8}{g.cached_tokens:>8}{ideal[i]:>8}{g.ttft_ms:>10.1f}"
              f"{(c.ttft_ms if c else float('nan')):>10.1f}  {'n/a' if same is None else same}")
    a = min(ratios) if ratios else float("nan")
    b = warm / cold_ms if cold_ms else float("nan")
    c = sum(equal) / len(equal) if ref else float("nan")
    print(f"BENCH agent_replay trace={name} cached_vs_ideal={a:.3f} warm_ttft_vs_cold={b:.3f} "
          f"outputs_equal={c:.3f} short_tax={tax:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
