"""Request intake: each Generate from a gateway is refused, left waiting for its model, or scheduled.

Checks, in this order: the engine is stopping; the named model is not served
here; its model is not loaded, or requests already wait for a load (it waits
too, in ``ServedModels.pending``, unless that queue is full); the prompt is
empty; a token is outside the vocabulary; the id is in use; its grammar does not
compile (a grammar not yet compiled is compiled off the loop first, the request
waiting in ``compiles`` meanwhile, ``engine.grammar_compiles``, and then comes
through these checks again); the scheduler's own limits (which refuse images for a model that takes
none, and match them to their placeholder runs otherwise). An accepted request becomes a scheduler ``Request`` and is tracked for
its output. Every refusal is counted by reason and model.
"""

from __future__ import annotations

from collections.abc import Callable

from ignis.engine.grammar_compiles import GrammarCompiles
from ignis.engine.metrics import EngineMetrics
from ignis.engine.request import Request
from ignis.engine.served_models import ServedModels
from ignis.engine.token_streams import TokenStreams
from ignis.shared.stop_request import StopRequest
from ignis.shared.wire import Finished, Generate, Refused, Usage
from ignis.shared.zmq_queues import Channel


class Intake:
    """Admits Generate messages into ``models``' loaded scheduler; ``max_queue`` bounds ``models.pending``;
    ``wake()`` is called from the compile worker when a grammar compile ends."""

    def __init__(self, channel: Channel, metrics: EngineMetrics, models: ServedModels, streams: TokenStreams,
                 stopping: StopRequest, max_queue: int, wake: Callable[[], None] = lambda: None):
        self.channel = channel
        self.metrics = metrics
        self.models = models
        self.streams = streams
        self.stopping = stopping
        self.max_queue = max_queue
        self.compiles = GrammarCompiles(wake)

    def refuse(self, peer: bytes, rid: str, reason: str, message: str) -> None:
        self.metrics.refused.labels(self.models.name, reason).inc()
        self.channel.send(Refused(rid, reason, message), peer)

    def generate(self, peer: bytes, msg: Generate) -> None:
        models = self.models
        if self.stopping.is_set():
            return self.refuse(peer, msg.id, "shutting_down", "the engine is shutting down")
        if msg.model is not None and msg.model not in models.dirs:
            return self.refuse(peer, msg.id, "unknown_model",
                               f"model {msg.model!r} is not served here (models: {', '.join(models.dirs)})")
        if models.must_wait(models.wanted(msg.model)):
            if len(models.pending) >= self.max_queue:
                return self.refuse(peer, msg.id, "queue_full",
                                   f"{len(models.pending)} requests wait for a model load (max_queue)")
            models.pending.append((peer, msg))  # served, in arrival order, once the model it names is loaded
            return
        runtime = models.runtime
        if not msg.prompt_ids:
            return self.refuse(peer, msg.id, "bad_request", "the prompt is empty")
        bad = next((t for t in msg.prompt_ids if t >= runtime.vocab_size), None)
        if bad is not None:
            return self.refuse(peer, msg.id, "bad_request",
                               f"token id {bad} is outside the vocabulary (size {runtime.vocab_size})")
        if msg.id in self.streams.tracked or msg.id in self.compiles:
            return self.refuse(peer, msg.id, "bad_request", f"request id {msg.id!r} is already in use")
        if msg.grammar is not None:
            lanes = runtime.runner.grammars
            if lanes is None:
                return self.refuse(peer, msg.id, "bad_request", "this model takes no grammars")
            if not lanes.constrained(msg.id, msg.grammar):
                return self.compiles.start(peer, msg, lanes)  # back through here once it has compiled
        slot = -1
        if msg.adapter is not None:
            lora = runtime.lora
            slot = lora.slot(msg.adapter) if lora is not None else None
            if slot is None:
                return self.refuse(peer, msg.id, "unknown_model",
                                   f"LoRA adapter {msg.adapter!r} is not served with model {runtime.name!r}")
        scheduler = runtime.scheduler
        req = Request.from_generate(msg, scheduler.config.page_tokens,
                                    adapter=None if slot < 0 else runtime.lora.identity(slot))
        req.adapter_slot = slot
        if not scheduler.store.enabled:
            req.must_cut_at = ()  # nothing is captured: no chunk ends or keeps an image at a mark
        refusal = scheduler.add(req)
        if refusal is not None:
            runtime.runner.release(msg.id)
            return self.refuse(peer, msg.id, refusal.reason, refusal.message)
        self.streams.track(peer, msg)

    def compiled(self) -> None:
        """Between rounds: each request whose grammar compile ended is refused (it does not compile) or
        taken in again (its grammar now cached; every other check is made again too)."""
        if not self.compiles.in_flight:
            return
        for done in self.compiles.finished():
            self.metrics.grammar_compile_seconds.observe(done.seconds)
            for peer, msg in done.requests:
                if done.error is not None:
                    self.refuse(peer, msg.id, "bad_request", f"the grammar does not compile: {done.error}"[:4096])
                else:
                    self.generate(peer, msg)

    def refuse_compiling(self, reason: str, message: str) -> None:
        """Every request still waiting for its grammar is refused (the engine is stopping)."""
        for peer, msg in self.compiles.withdraw_all():
            self.refuse(peer, msg.id, reason, message)

    @property
    def num_waiting(self) -> int:
        """Requests waiting here, before the scheduler: for a model load or switch, or for their grammar."""
        return len(self.models.pending) + len(self.compiles)

    def waiting_peers(self) -> set[bytes]:
        """The gateways of the requests that wait here: for a model load or for their grammar."""
        return {peer for peer, _ in self.models.pending} | {peer for peer, _ in self.compiles.waiting.values()}

    def waiting_ids(self, peer: bytes) -> list[str]:
        return ([msg.id for p, msg in self.models.pending if p == peer]
                + [rid for rid, (p, _) in self.compiles.waiting.items() if p == peer])

    def abort_pending(self, rid: str) -> bool:
        """An Abort for a request still waiting for its model or its grammar: it ends here, with nothing
        generated."""
        item = self.models.withdraw(rid) or self.compiles.withdraw(rid)
        if item is None:
            return False
        peer, msg = item
        self.channel.send(Finished(rid, "abort", Usage(len(msg.prompt_ids), 0)), peer)
        return True
