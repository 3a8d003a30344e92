"""A scripted stand-in for the engine: a ROUTER on a thread that answers by the request's seed.

    seed 0   one token, then nothing until an Abort (answered with Finished abort)
    seed 1   Refused queue_full          seed 4   Refused shutting_down
    seed 2   Refused too_long            seed 5   two tokens, then Finished error
    seed 3   Refused unknown_model       seed 6   Admitted (one cached token), then nothing until an Abort
    other    Admitted (one cached token), ``max_tokens`` tokens (``UNDERSCORE``), then Finished stop (cached 1)

A request whose grammar holds ``GRAMMAR_REFUSED`` is Refused bad_request (a grammar the engine cannot compile).
Stats are answered with a small max_model_len and the demo model's vocab_size. Every Abort is recorded.
A profiler start or stop (``Profile``) is refused as by an engine without ``--profile-dir``.
``stats_extra`` joins every Stats reply; ``ListAdapters`` is answered with ``adapter_list``
(version, names, paths).
A cache reset (``FlushCache``) is answered flushed, with ``flush_entries`` entries, or refused with
``flush_refusal`` when that is set.
``script(seed, token_ids)`` makes that seed stream those tokens, one per
batch, then Finished stop (a test's stand-in for a trained model's output);
``queue(token_ids)`` does the same for the next request without a seed (in
order; once they are used up, the last one keeps answering).
"""

from __future__ import annotations

import queue
import threading

import zmq

from ignis.shared.wire import (
    GATEWAY_TO_ENGINE,
    Abort,
    AdapterList,
    Admitted,
    CacheFlushed,
    Finished,
    FlushCache,
    Generate,
    ListAdapters,
    Profile,
    Profiled,
    Refused,
    Stats,
    StatsReply,
    StreamTokens,
    TokenBatch,
    Usage,
)
from ignis.shared.zmq_queues import bind_router

REFUSALS = {1: "queue_full", 2: "too_long", 3: "unknown_model", 4: "shutting_down"}
GRAMMAR_REFUSED = "fakeenginerefuses"
"""A grammar holding this text is refused as one that does not compile with the model's vocabulary."""
MAX_MODEL_LEN = 4096
VOCAB_SIZE = 248_320
"""The demo model's config ``vocab_size`` (Qwen3.5's), which a real engine reports."""
UNDERSCORE = 62
"""The id of "_" in Qwen3.5's vocabulary (the demo model's)."""


class FakeEngine:
    def __init__(self, endpoint: str):
        self.ctx = zmq.Context()
        self.channel = bind_router(self.ctx, endpoint, GATEWAY_TO_ENGINE, name="fake-engine").start()
        self.aborts: list[str] = []
        self.started = 1.0  # what it reports as engine_started_unix; a change looks like a restart
        self.generates: list[Generate] = []
        self.scripts: dict[int, tuple[int, ...]] = {}
        self.queued: list[tuple[int, ...]] = []
        self._held: dict[str, tuple[bytes, int]] = {}
        self.flushes = 0
        self.flush_entries = 0
        self.flush_refusal: str | None = None
        self.stats_extra: dict = {}
        self.served: tuple[str, ...] = ()  # the model names its Stats say it serves (none said by default)
        self.adapter_list: tuple[int, tuple[str, ...], tuple[str, ...]] = (0, (), ())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                env = self.channel.get(timeout=0.05)
            except queue.Empty:
                continue
            msg, peer = env.message, env.peer
            if isinstance(msg, Stats):
                self.channel.send(StatsReply({"max_model_len": MAX_MODEL_LEN, "vocab_size": VOCAB_SIZE,
                                                "engine_started_unix": self.started, **self.stats_extra},
                                               self.served), peer)
            elif isinstance(msg, ListAdapters):
                self.channel.send(AdapterList(msg.id, *self.adapter_list), peer)
            elif isinstance(msg, Abort):
                self.aborts.append(msg.id)
                held = self._held.pop(msg.id, None)
                if held is not None:
                    self.channel.send(Finished(msg.id, "abort", Usage(held[1], 1)), held[0])
            elif isinstance(msg, Generate):
                self.generates.append(msg)
                self._answer(msg, peer)
            elif isinstance(msg, Profile):  # an engine without --profile-dir
                self.channel.send(Profiled(msg.id, False, "profiling is off: start the engine with --profile-dir DIR"),
                                  peer)
            elif isinstance(msg, FlushCache):
                self.flushes += 1
                refusal = self.flush_refusal
                self.channel.send(CacheFlushed(msg.id, refusal is None, 0 if refusal else self.flush_entries,
                                               refusal or ""), peer)

    def script(self, seed: int, token_ids) -> None:
        self.scripts[seed] = tuple(token_ids)

    def queue(self, token_ids) -> None:
        self.queued.append(tuple(token_ids))

    def _answer(self, msg: Generate, peer: bytes) -> None:
        seed = msg.sampling.seed
        if seed is None and self.queued:
            self.scripts[None] = self.queued.pop(0)
        usage = Usage(prompt_tokens=len(msg.prompt_ids), completion_tokens=2, cached_tokens=1)
        if seed in self.scripts:
            ids = self.scripts[seed][:msg.sampling.max_tokens]
            for token in ids:
                self.channel.send(TokenBatch((StreamTokens(msg.id, (token,)),)), peer)
            reason = "length" if len(ids) < len(self.scripts[seed]) else "stop"
            self.channel.send(Finished(msg.id, reason, Usage(len(msg.prompt_ids), len(ids), 0)), peer)
        elif seed == 0:
            self.channel.send(TokenBatch((StreamTokens(msg.id, (UNDERSCORE,)),)), peer)
            self._held[msg.id] = (peer, len(msg.prompt_ids))
        elif msg.grammar is not None and GRAMMAR_REFUSED in msg.grammar:
            self.channel.send(Refused(msg.id, "bad_request", "the grammar does not compile: scripted"), peer)
        elif seed in REFUSALS:
            self.channel.send(Refused(msg.id, REFUSALS[seed], f"scripted {REFUSALS[seed]}"), peer)
        elif seed == 6:  # admitted, its prefill never ends
            self.channel.send(Admitted(msg.id, 1), peer)
            self._held[msg.id] = (peer, len(msg.prompt_ids))
        elif seed == 5:
            for _ in range(2):
                self.channel.send(TokenBatch((StreamTokens(msg.id, (UNDERSCORE,)),)), peer)
            self.channel.send(Finished(msg.id, "error", usage, message="scripted failure"), peer)
        else:
            n = msg.sampling.max_tokens
            self.channel.send(Admitted(msg.id, 1), peer)
            for _ in range(n):
                self.channel.send(TokenBatch((StreamTokens(msg.id, (UNDERSCORE,)),)), peer)
            self.channel.send(Finished(msg.id, "stop", Usage(len(msg.prompt_ids), n, 1)), peer)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.channel.close()
        self.ctx.term()
