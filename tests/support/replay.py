"""Replaying recorded chat-completions traces against a live server: the client side.

A trace is JSON lines, one request a line: ``seq`` (order sent), ``run``,
``client``, ``path`` and ``body`` (the request as sent, minus ``model``);
``t`` (seconds from the trace's start), when present, is when it was sent.
Each request is replayed streaming, greedy (temperature 0), with
``max_tokens`` capped and vLLM's ``return_token_ids``, so the reply gives the
server's own tokenization of the prompt, the output ids, usage (cached
tokens included) and the time to the first chunk, which the gateway sends
only once the engine has answered (the time to first token as a client sees
it).

The *ideal* of a request is the longest prefix, in whole pages, that its
prompt shares with any earlier prompt of the replay. Used by
``bench/agent_replay.py`` and the replay tests.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ignis.gateway.turn_boundaries import common_prefix_len

ROOT = Path(__file__).resolve().parents[2]
QWEN_CODE_TRACE = ROOT.parent / "shared" / "fixtures" / "agent-traces" / "qwen-code.jsonl"
PAGE_TOKENS = 64


@dataclass(frozen=True)
class TraceRequest:
    seq: int
    run: int
    path: str
    body: dict
    t: float | None = None


@dataclass
class Reply:
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft_ms: float = 0.0
    finish_reason: str | None = None


def load_trace(path: str | Path, limit: int | None = None) -> list[TraceRequest]:
    """The trace's requests in the order they were sent (``limit``: the first ones only)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            o = json.loads(line)
            out.append(TraceRequest(int(o["seq"]), int(o.get("run", 0)), o.get("path", "/v1/chat/completions"),
                                    o["body"], o.get("t")))
    out.sort(key=lambda r: r.seq)
    return out[:limit] if limit is not None else out


def shrink(trace: list[TraceRequest], factor: int, max_tools: int) -> list[TraceRequest]:
    """A smaller trace of the same shape: every text over 200 characters cut to 1/``factor`` of its
    length (the same cut wherever the same text recurs, so what repeats still repeats) and the first
    ``max_tools`` tools kept."""
    def cut(text: str) -> str:
        return text[:len(text) // factor] if len(text) > 200 else text

    def message(m: dict) -> dict:
        c = m.get("content")
        if isinstance(c, str):
            return dict(m, content=cut(c))
        if isinstance(c, list):
            return dict(m, content=[dict(p, text=cut(p["text"])) if "text" in p else p for p in c])
        return m

    out = []
    for r in trace:
        body = dict(r.body, messages=[message(m) for m in r.body["messages"]])
        if "tools" in body:
            body["tools"] = body["tools"][:max_tools]
        out.append(TraceRequest(r.seq, r.run, r.path, body, r.t))
    return out


def replay_body(body: dict, model: str, max_tokens: int) -> dict:
    """The recorded body for this server: its model, greedy, streamed, token ids returned, max_tokens capped."""
    out = dict(body, model=model, temperature=0, stream=True, stream_options={"include_usage": True},
               return_token_ids=True)
    out["max_tokens"] = min(int(body.get("max_tokens") or max_tokens), max_tokens)
    out.pop("max_completion_tokens", None)
    return out


def send(url: str, api_key: str, path: str, body: dict, timeout: float = 600) -> Reply:
    """One streamed request; the reply's prompt ids, output ids, usage and time to the first chunk."""
    req = urllib.request.Request(url.rstrip("/") + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"})
    t0 = time.perf_counter()
    reply = Reply(prompt_ids=[])
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            if not reply.ttft_ms:
                reply.ttft_ms = (time.perf_counter() - t0) * 1000
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"the server failed the request: {chunk['error']}")
            if "prompt_token_ids" in chunk:
                reply.prompt_ids = chunk["prompt_token_ids"]
            for choice in chunk.get("choices") or ():
                reply.output_ids.extend(choice.get("token_ids") or ())
                reply.finish_reason = choice.get("finish_reason") or reply.finish_reason
            if chunk.get("usage"):
                u = chunk["usage"]
                reply.prompt_tokens = u["prompt_tokens"]
                reply.cached_tokens = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return reply


def replay(trace: list[TraceRequest], url: str, api_key: str, model: str, max_tokens: int,
           concurrency: int = 1, timed: bool = False) -> list[Reply]:
    """Every request of ``trace``, in order: one at a time, up to ``concurrency`` at once, or (``timed``)
    each at its recorded ``t`` (the recorded concurrency). Replies are in trace order."""
    if timed and any(r.t is None for r in trace):
        raise ValueError("--timed needs a recorded time 't' on every request of the trace")

    def one(r: TraceRequest, start: float) -> Reply:
        if timed:
            delay = start + r.t - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # pacing the replay to the recorded schedule, not waiting for state
        return send(url, api_key, r.path, replay_body(r.body, model, max_tokens))

    workers = len(trace) if timed else max(1, concurrency)
    if workers == 1:
        return [one(r, 0.0) for r in trace]
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda r: one(r, start), trace))


def ideals(prompts: list[list[int]], page_tokens: int = PAGE_TOKENS) -> list[int]:
    """Per prompt: the longest prefix in whole pages it shares with any earlier prompt."""
    return [max((common_prefix_len(p, q) // page_tokens * page_tokens for q in prompts[:i]), default=0)
            for i, p in enumerate(prompts)]
