"""The models one engine serves: which is loaded, the requests waiting for a load, idle unload.

At most one model is loaded at a time (none after an idle unload). A request
for a model that is not loaded waits in ``pending``, in arrival order, and so
does every request behind it; once the loaded model has no work left the loop
switches to the model of the oldest pending request
(``EngineServer._service_models``) and hands back to intake every pending
request for it, then the others, which wait again: a model's requests that
waited are served by one switch, and no request waits more than one switch
per other model ahead of it. Unloading closes the ``Runtime``, which frees retained state in
every tier; a Stats reply keeps showing the model's sizes meanwhile.

Context lengths. Each model's longest sequence is in the Stats reply as
``max_model_len_<i>`` (``i``: its place in the served list), so a gateway
checks a request against the model it names, not the one loaded: the exact
length once the model was loaded, before that the bound its config gives
(``--max-model-len``, else ``max_position_embeddings``; the KV pool may cap
it lower at load).
"""

from __future__ import annotations

import logging
import time
from collections import deque

log = logging.getLogger("ignis.engine")

LOAD_GRACE_S = 600.0
"""How long a model load may hold the loop before the watchdogs count it stuck (systemd's start timeout is
extended by as much while the engine loads)."""

KEPT_WHILE_UNLOADED = ("max_model_len", "decode_lanes", "pool_pages_total", "vocab_size")
"""Stats a reply still carries while no model is loaded (the last loaded model's)."""


class ServedModels:
    """``dirs`` maps each served name to its checkpoint (None: the demo); ``loader(name)`` loads a runtime."""

    def __init__(self, runtime, dirs: dict | None = None, loader=None, lengths: dict | None = None):
        self.runtime = runtime
        self.dirs = dict(dirs or {runtime.name: None})
        self.lengths = dict(lengths or {})  # name -> longest sequence: from its config, exact once loaded
        self._note_length()
        self.default = next(iter(self.dirs))
        self.loader = loader
        self.name = runtime.name  # the loaded model, else the last one loaded
        self.pending: deque = deque()  # (peer, Generate) waiting for a model switch or load
        self.redispatching = False  # pending requests are being handed back to intake
        self.last_busy = time.monotonic()
        self.unloaded_stats: dict = {}
        self.loading_since: float | None = None  # monotonic start of a load in progress (the loop is in it)
        self.load_ended = 0.0

    @property
    def loaded(self) -> bool:
        return self.runtime is not None

    @property
    def has_work(self) -> bool:
        return self.loaded and self.runtime.scheduler.has_work

    def wanted(self, model: str | None) -> str:
        """The model a request is for: the one it names, else the loaded one, else the default."""
        return model or (self.name if self.loaded else self.default)

    def must_wait(self, wanted: str) -> bool:
        """A request for ``wanted`` joins ``pending``: its model is not loaded, or requests
        already wait (arrival order holds), unless it is itself being handed back to the
        model just loaded."""
        handed_back = self.redispatching and not self.pending and self.loaded and wanted == self.name
        return (not self.loaded or wanted != self.name or bool(self.pending)) and not handed_back

    def withdraw(self, rid: str):
        """Take the pending ``(peer, Generate)`` with id ``rid`` out of the queue; None if none waits."""
        for item in list(self.pending):
            if item[1].id == rid:
                self.pending.remove(item)
                return item
        return None

    def take_pending(self) -> list:
        """Every pending ``(peer, Generate)``: those for the loaded model first, then the others, each in
        arrival order; the queue starts again empty. Handed back to intake in this order, every request
        for the loaded model is admitted and the others wait again (the first of them names the next
        switch), so one switch serves all that waited for a model, not only those up to the first request
        for another."""
        mine = [p for p in self.pending if self.wanted(p[1].model) == self.name]
        rest = [p for p in self.pending if self.wanted(p[1].model) != self.name]
        self.pending = deque()
        return mine + rest

    def drop_pending(self, model: str) -> list:
        """Take every pending request for ``model`` out of the queue (its load failed)."""
        dropped = [p for p in self.pending if (p[1].model or model) == model]
        for item in dropped:
            self.pending.remove(item)
        return dropped

    def unload(self, why: str, stats: dict) -> None:
        """Close the loaded runtime; ``stats`` (its last Stats) keeps the sizes a reply still shows."""
        name = self.runtime.name
        self.unloaded_stats = {k: v for k, v in stats.items() if k in KEPT_WHILE_UNLOADED}
        self.unloaded_stats["pool_pages_free"] = self.unloaded_stats.get("pool_pages_total", 0)
        self.runtime.close()
        self.runtime = None
        log.info("unloaded model %s (%s): all retained state freed in every tier", name, why)

    def load(self, name: str) -> None:
        """Load ``name``; nothing may be loaded. Raises what the loader raises."""
        from ignis.shared import sdnotify

        sdnotify.status(f"loading model {name}")
        sdnotify.extend_timeout(600)
        self.loading_since = time.monotonic()
        try:
            self.runtime = self.loader(name)
        finally:
            self.load_ended = time.monotonic()  # first: a watchdog never sees the load's time as a stall
            self.loading_since = None
        self.name = name
        self._note_length()
        self.last_busy = time.monotonic()
        sdnotify.status(f"serving {name}")

    def _note_length(self) -> None:
        scheduler = getattr(self.runtime, "scheduler", None)
        if scheduler is not None:
            self.lengths[self.runtime.name] = scheduler.config.max_model_len

    def length_stats(self) -> dict:
        """``max_model_len_<i>`` of every served model whose length is known (``i``: its place in the list)."""
        return {f"max_model_len_{i}": self.lengths[name] for i, name in enumerate(self.dirs) if name in self.lengths}

    def check_idle(self, idle_unload_s: float | None) -> bool:
        """Between rounds: notes work in progress; True once the loaded model has had no work
        and no pending request for more than ``idle_unload_s`` seconds (None: never)."""
        if self.has_work:
            self.last_busy = time.monotonic()
            return False
        return (self.loaded and idle_unload_s is not None and not self.pending
                and time.monotonic() - self.last_busy > idle_unload_s)
