"""LoRA adapters loaded and unloaded while serving (vLLM's ``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``).

Only with ``--enable-lora-updating`` (vLLM asks for ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``):
anyone holding the API key can then make the engine read a directory.

``AdapterRegistry`` is what the default model is served with: the
``--lora-modules`` adapters (a bad one stops the engine at start) and those
loaded since (kept across idle unloads and model switches: a reload reads
them again, and one whose files went bad meanwhile, ``--lora-modules`` ones
included, is dropped with a warning, never failing the load; the registry
then lets it go too, so no list names an adapter that is not served and its
name can be loaded again). ``LoraUpdates`` answers the gateway's
``LoadAdapter``/``UnloadAdapter`` between rounds (the adapted layers change
only between forwards):

- a load reads the adapter's files on a reader thread, off the engine loop
  (a large adapter takes seconds to read and check, and every running stream
  would wait for it), then the loop puts it in between rounds and serves it;
  refused (nothing changed) when updating is off, the default model is not
  loaded (or was unloaded while the files were read), the name is taken by an
  adapter, a model or a load in progress, ``MAX_READS_WAITING`` loads wait
  already, or the adapter is refused as at start (``engine.models.lora``);
- an in-place load (``inplace``, vLLM's ``load_inplace``) of a served name is
  read and checked the same way, then the loop replaces that adapter's
  weights with the new files (``LoraSet.replace``, same slot) and the
  registry's path for the name becomes the new one (``--lora-modules`` ones
  too); refused, the old adapter serving on untouched, for all the reasons
  above and while a request in flight names the adapter (asked when the load
  is asked and again when it is put in, as an unload is). The new files'
  digest makes a new identity: state made under the old weights is never
  resumed under the new ones. Of a name not served, it is a plain load;
- ``ListAdapters`` is answered with every adapter served now; the registry's
  ``version`` (in the Stats) moves with each load, in-place load and unload, so a gateway
  that did not ask for the change (there may be several) learns of it;
- an unload stops serving it; refused while a request in flight (running,
  waiting, or waiting before the scheduler) names it, and for an unknown
  name. State it retained stays scoped to its name and files' digest: a later
  adapter under the name resumes none of it unless its files are the same.

Names and paths come from API clients: log lines print them with ``%r``, so
a newline or an escape sequence in one cannot forge or dress a line.

``FAULT_STALL_LOAD_ENV`` (tests only) holds the engine loop that many
seconds when a run-time load is asked, a stand-in for a loop turn that
hangs: the loop watchdog's test uses it.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import weakref
from collections.abc import Callable

from ignis.shared.wire import AdapterList, AdapterUpdated, ListAdapters, LoadAdapter, UnloadAdapter
from ignis.shared.fault_env import env_seconds

log = logging.getLogger("ignis.engine")


class AdapterRegistry:
    def __init__(self, flagged: list[tuple[str, str]]):
        self.flagged = list(flagged)
        self.added: dict[str, str] = {}
        self.version = 0
        """Counts the loads, in-place loads and unloads done while serving (and the adapters a reload dropped):
        the Stats' ``lora_adapters_version``, by which gateways see that their list of adapters is stale
        (``ListAdapters``)."""
        self.serving = False
        """Set once the engine serves (``LoraUpdates``): from then on a ``--lora-modules`` adapter whose files
        went bad is dropped at a reload, as a run-time one is, rather than failing the default model's load."""

    def specs(self) -> list[tuple[str, str, bool]]:
        """(name, path, required) of every adapter the default model is served with, in load order."""
        return [(n, p, not self.serving) for n, p in self.flagged] + [(n, p, False) for n, p in self.added.items()]

    def names(self) -> set[str]:
        return {n for n, _ in self.flagged} | set(self.added)

    def path(self, name: str) -> str | None:
        return dict(self.flagged).get(name, self.added.get(name))

    def replace(self, name: str, path: str) -> None:
        """Adapter ``name`` (served) is read from ``path`` from now on, in its place in the load order: a
        reload reads the new files, and the version moves so every gateway's list takes the new path."""
        self.flagged = [(n, path if n == name else p) for n, p in self.flagged]
        if name in self.added:
            self.added[name] = path
        self.version += 1

    def keep_only(self, served: set[str]) -> list[str]:
        """Let go of the adapters not in ``served`` (those a reload of the default model dropped); their names."""
        gone = [n for n, _, _ in self.specs() if n not in served]
        if gone:
            self.flagged = [(n, p) for n, p in self.flagged if n in served]
            self.added = {n: p for n, p in self.added.items() if n in served}
            self.version += 1
        return gone


FAULT_STALL_LOAD_ENV = "IGNIS_ENGINE_FAULT_STALL_LORA_LOAD_S"
MAX_READS_WAITING = 8
"""Run-time loads asked and not yet read: more are refused (each read holds an adapter's bytes)."""


UNLOADED = "the default model was unloaded while the adapter was read: send it a request, then load the adapter again"


class _Read:
    """One run-time load: asked on the loop, read on the reader thread, put in on the loop. The runtime and
    its model are held weakly: an unload or a switch frees them even while loads wait."""

    def __init__(self, peer: bytes, msg: LoadAdapter, runtime, users: Callable[[str], int]):
        self.peer, self.msg, self.users = peer, msg, users
        self.runtime = weakref.ref(runtime)
        self.model = weakref.ref(runtime.runner.model)
        self.adapter = None
        self.error: str | None = None
        self.cancelled = False  # answered already (the engine stopping): the reader drops it


class LoraUpdates:
    def __init__(self, enabled: bool, registry: AdapterRegistry, max_rank: int, model_names,
                 send: Callable[[object, bytes], None], wake: Callable[[], None] = lambda: None):
        """``wake``: called from the reader thread when a read ended (the loop then calls ``service``)."""
        self.enabled = enabled
        self.registry = registry
        self.max_rank = max_rank
        self.model_names = set(model_names)
        self._send = send
        self._wake = wake
        self._lock = threading.Lock()
        self._waiting: collections.deque[_Read] = collections.deque()  # asked, not read yet (the head: reading)
        self._read: list[_Read] = []  # read, to be put in by the loop
        self._reader: threading.Thread | None = None
        self._followed = None  # a weak reference to the default model's runtime the registry was last matched to
        registry.serving = True  # the default model was loaded at start: a later load drops a bad adapter

    def handle(self, peer: bytes, msg, runtime, default_loaded: bool, users: Callable[[str], int]) -> None:
        """``runtime``: the loaded model's (None: none); ``default_loaded``: it is the default model;
        ``users(name)``: requests in flight that name adapter ``name``."""
        if not self.enabled:
            return self._answer(peer, msg, False, "loading and unloading LoRA adapters at run time is off "
                                                  "(--enable-lora-updating)")
        if isinstance(msg, LoadAdapter):
            return self._load(peer, msg, runtime if default_loaded else None, users)
        return self._unload(peer, msg, runtime if default_loaded else None, users)

    def _load(self, peer: bytes, msg: LoadAdapter, runtime, users: Callable[[str], int]) -> None:
        stall = env_seconds(FAULT_STALL_LOAD_ENV)
        if stall > 0:
            log.warning("FAULT INJECTION: %s=%g holds the engine loop in this adapter load (for tests only)",
                        FAULT_STALL_LOAD_ENV, stall)
            time.sleep(stall)
        if msg.name in self.model_names:
            return self._answer(peer, msg, False, f"{msg.name!r} already names a served model")
        if msg.name in self.registry.names():
            if not msg.inplace:
                return self._answer(peer, msg, False, _taken(msg.name))
            if n := users(msg.name):  # asked again once read: requests may come meanwhile
                return self._answer(peer, msg, False, _in_use(msg.name, n))
        if runtime is None:
            return self._answer(peer, msg, False, "the default model is not loaded: send it a request first")
        with self._lock:
            if self._being_loaded(msg.name):
                return self._answer(peer, msg, False, f"the LoRA adapter {msg.name!r} is being loaded")
            if len(self._waiting) >= MAX_READS_WAITING:
                return self._answer(peer, msg, False, f"{MAX_READS_WAITING} adapter loads are waiting already: "
                                                      "try again once they are done")
            self._waiting.append(_Read(peer, msg, runtime, users))
            if self._reader is None:
                self._reader = threading.Thread(target=self._read_all, name="lora-reader", daemon=True)
                self._reader.start()

    def _being_loaded(self, name: str) -> bool:
        """A load of ``name`` is asked and not yet put in (with the lock held)."""
        return any(r.msg.name == name for r in (*self._waiting, *self._read))

    def _read_all(self) -> None:
        """The reader thread: each waiting load's files read and checked, in the order asked."""
        from ignis.engine.models.checkpoint_error import CheckpointError
        from ignis.engine.models.lora import read_adapter

        while True:
            with self._lock:
                while self._waiting and self._waiting[0].cancelled:
                    self._waiting.popleft()
                if not self._waiting:
                    self._reader = None
                    return
                r = self._waiting[0]
            model = r.model()
            try:
                if model is None:
                    r.error = UNLOADED
                else:
                    r.adapter = read_adapter(r.msg.name, r.msg.path, model, self.max_rank)
            except (CheckpointError, OSError, ValueError) as exc:
                r.error = str(exc)
            except Exception as exc:  # a reader bug must answer its load, not leave it waiting
                log.exception("reading LoRA adapter %r failed", r.msg.name)
                r.error = f"reading the adapter failed ({type(exc).__name__})"
            del model  # the read's only strong hold on it
            with self._lock:
                if self._waiting and self._waiting[0] is r:
                    self._waiting.popleft()
                if not r.cancelled:
                    self._read.append(r)
            self._wake()

    @property
    def reading(self) -> bool:
        """Loads are being read or wait to be put in (the loop calls ``service`` while so)."""
        with self._lock:
            return bool(self._waiting or self._read)

    def service(self, runtime, default_loaded: bool) -> None:
        """Between rounds: put in the adapters read since the last call (``runtime``: the loaded model's,
        None when none; ``default_loaded``: it is the default model)."""
        from ignis.engine.models.lora import LoraSet

        self._follow_load(runtime if default_loaded else None)
        with self._lock:
            done, self._read = self._read, []
        for r in done:
            msg, adapter = r.msg, r.adapter
            if r.error is not None:
                self._answer(r.peer, msg, False, r.error)
            elif runtime is None or runtime is not r.runtime() or not default_loaded:
                self._answer(r.peer, msg, False, UNLOADED)
            elif msg.name in self.model_names or (msg.name in self.registry.names() and not msg.inplace):
                self._answer(r.peer, msg, False, _taken(msg.name))
            elif msg.name in self.registry.names():
                self._replace(r, runtime)
            else:
                model = runtime.runner.model
                if model.lora is None:
                    LoraSet(model, [adapter])
                else:
                    model.lora.add(adapter)
                self.registry.added[msg.name] = msg.path
                self.registry.version += 1
                log.info("LoRA adapter %r loaded at run time: rank %d, scale %g, %d layers, from %r", adapter.name,
                         adapter.rank, adapter.scale, len(adapter.weights), adapter.path)
                self._answer(r.peer, msg, True, f"LoRA adapter {msg.name!r} added")

    def _replace(self, r: _Read, runtime) -> None:
        """An in-place load read: the adapter of its name is replaced, unless requests in flight use it."""
        msg, adapter = r.msg, r.adapter
        if n := r.users(msg.name):
            return self._answer(r.peer, msg, False, _in_use(msg.name, n))
        old, lora = self.registry.path(msg.name), runtime.runner.model.lora
        if lora is None or lora.slot(msg.name) is None:  # never: _follow_load matched the registry to the set
            log.error("LoRA adapter %r is in the registry but not served: not replaced", msg.name)
            return self._answer(r.peer, msg, False, f"the LoRA adapter {msg.name!r} is not served now")
        lora.replace(adapter)
        self.registry.replace(msg.name, msg.path)
        log.info("LoRA adapter %r replaced in place: rank %d, scale %g, %d layers, from %r (was %r)", adapter.name,
                 adapter.rank, adapter.scale, len(adapter.weights), adapter.path, old)
        self._answer(r.peer, msg, True, f"LoRA adapter {msg.name!r} replaced in place")

    def _follow_load(self, runtime) -> None:
        """Once per load of the default model (``runtime``; None: not loaded): the adapters that load dropped,
        their files gone bad since they were read, leave the registry, and its version moves, so every gateway's
        list follows and the name can be loaded again."""
        if runtime is None or (self._followed is not None and self._followed() is runtime):
            return
        self._followed = weakref.ref(runtime)
        lora = runtime.lora
        if lora is None:  # loaded with no adapter to read (each load of the default model with some makes a set)
            return
        for name in self.registry.keep_only(set(lora.slots)):
            log.warning("LoRA adapter %r is no longer served: its files did not read when the model loaded again",
                        name)

    def refuse_all(self, message: str) -> None:
        """Answer every load asked and not yet put in (the engine is stopping); a read in progress goes on
        on its daemon thread and is dropped when it ends."""
        with self._lock:
            pending = [r for r in (*self._waiting, *self._read) if not r.cancelled]
            for r in pending:
                r.cancelled = True  # the reader skips those not begun, drops the one it reads
            self._read = []
        for r in pending:
            self._answer(r.peer, r.msg, False, message)

    def _unload(self, peer: bytes, msg: UnloadAdapter, runtime, users: Callable[[str], int]) -> None:
        with self._lock:
            loading = self._being_loaded(msg.name)
        if loading:
            return self._answer(peer, msg, False, f"the LoRA adapter {msg.name!r} is still being loaded")
        if msg.name not in self.registry.names():
            return self._answer(peer, msg, False, f"the LoRA adapter {msg.name!r} cannot be found", missing=True)
        if n := users(msg.name):
            return self._answer(peer, msg, False, _in_use(msg.name, n))
        if runtime is not None and runtime.lora is not None:
            runtime.lora.remove(msg.name)
        self.registry.flagged = [(n, p) for n, p in self.registry.flagged if n != msg.name]
        self.registry.added.pop(msg.name, None)
        self.registry.version += 1
        log.info("LoRA adapter %r unloaded", msg.name)
        self._answer(peer, msg, True, f"LoRA adapter {msg.name!r} removed")

    def list(self, peer: bytes, msg: ListAdapters) -> None:
        """Answer a gateway's ``ListAdapters``: every adapter served now, whether updating is on or not."""
        specs = self.registry.specs()
        self._send(AdapterList(msg.id, self.registry.version, tuple(n for n, _, _ in specs),
                               tuple(p for _, p, _ in specs)), peer)

    def _answer(self, peer: bytes, msg, ok: bool, message: str, missing: bool = False) -> None:
        if not ok:
            log.info("LoRA adapter %r refused: %r", msg.name, message)
        self._send(AdapterUpdated(msg.id, ok, message, missing), peer)


def _taken(name: str) -> str:
    return f"the LoRA adapter {name!r} is already loaded (load_inplace: true replaces its weights)"


def _in_use(name: str, n: int) -> str:
    return f"the LoRA adapter {name!r} is in use by {n} request{'' if n == 1 else 's'} in flight"
