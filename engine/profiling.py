"""The engine's torch profiler, started and stopped while serving (vLLM's /start_profile and /stop_profile).

With ``--profile-dir DIR`` a gateway's ``Profile`` message starts
``torch.profiler`` on the engine's loop (CPU activity, and CUDA's on a GPU,
with input shapes); every served round is a profiler step and a
``ignis.round`` range in the trace. A stop, or the round count a start asked
for, ends it and writes two files into DIR:

    ignis-engine-INSTANCE-YYYYmmdd-HHMMSS.trace.json   the Chrome trace (chrome://tracing, Perfetto)
    ignis-engine-INSTANCE-YYYYmmdd-HHMMSS.top.txt      the operators by self time (the table
                                                        docs/performance.md takes its top costs from)

Writing them runs on the loop, between rounds: a long profile pauses serving
for the seconds its export takes (the log says how long). The engine's
shutdown writes an unfinished profile. Without ``--profile-dir`` a start is
refused, naming the flag; a second start, or a stop with none running, is
refused too (a stop after a profile that ended by its round count answers
that profile's files). Every answer is a ``Profiled`` to the gateway that asked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable

from ignis.shared.wire import Profile, Profiled

log = logging.getLogger("ignis.engine")

TOP_ROWS = 60


class RoundProfiler:
    def __init__(self, directory: str | None, instance: str, send: Callable[[object, bytes], None]):
        self.directory = directory
        self.instance = instance
        self._send = send
        self._cuda = False
        self._unclaimed: tuple[str, str] | None = None  # the files of a profile that stopped by its round count
        self._prof = None
        self._rounds = 0
        self._limit = 0
        self._started = 0.0

    @property
    def active(self) -> bool:
        return self._prof is not None

    def handle(self, peer: bytes, msg: Profile) -> None:
        if msg.start:
            why = self._start(msg.rounds)
            self._send(Profiled(msg.id, why is None, why or "profiling"), peer)
        elif self._prof is not None:
            trace, summary = self._stop()
            self._send(Profiled(msg.id, True, f"profiled {self._rounds} rounds", trace, summary), peer)
        elif self._unclaimed is not None:
            (trace, summary), self._unclaimed = self._unclaimed, None
            self._send(Profiled(msg.id, True, f"profiled {self._rounds} rounds (the count the start asked for)",
                                trace, summary), peer)
        else:
            why = ("profiling is off: start the engine with --profile-dir DIR" if self.directory is None
                   else "the engine is not profiling")
            self._send(Profiled(msg.id, False, why), peer)

    def round(self):
        """A context for one served round: its range in the trace, and a profiler step after it."""
        if self._prof is None:
            return contextlib.nullcontext()
        return self._round()

    @contextlib.contextmanager
    def _round(self):
        import torch

        with torch.profiler.record_function("ignis.round"):
            yield
        self._prof.step()
        self._rounds += 1
        if self._limit and self._rounds >= self._limit:
            self._unclaimed = self._stop()

    def close(self) -> None:
        """At shutdown: write a profile still running."""
        if self._prof is not None:
            self._stop()

    def _start(self, rounds: int) -> str | None:
        """Start profiling; why not (None: started)."""
        if self.directory is None:
            return "profiling is off: start the engine with --profile-dir DIR"
        if self._prof is not None:
            return f"the engine is already profiling (for {time.monotonic() - self._started:.0f} s)"
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as exc:
            return f"--profile-dir {self.directory}: {exc.strerror or exc}"
        import torch
        from torch.profiler import ProfilerActivity, profile

        self._cuda = torch.cuda.is_available()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self._cuda else [])
        self._prof = profile(activities=activities, record_shapes=True)
        self._prof.start()
        self._rounds, self._limit, self._started, self._unclaimed = 0, rounds, time.monotonic(), None
        log.info("profiling started%s", f" for {rounds} rounds" if rounds else "")
        return None

    def _stop(self) -> tuple[str, str]:
        """Stop and write the trace and the table; their paths (empty where a write failed, which is logged)."""
        prof, self._prof = self._prof, None
        began = time.monotonic()
        prof.stop()
        base = stem = os.path.join(self.directory, f"ignis-engine-{self.instance}-{time.strftime('%Y%m%d-%H%M%S')}")
        n = 1
        while os.path.exists(stem + ".trace.json") or os.path.exists(stem + ".top.txt"):
            n += 1  # another profile of the same second: its own files, the first one's kept
            stem = f"{base}-{n}"
        trace, summary = stem + ".trace.json", stem + ".top.txt"
        try:
            prof.export_chrome_trace(trace)
        except Exception:  # a profile that cannot be written must not take the loop down
            log.exception("profiling: cannot write %s", trace)
            trace = ""
        sort = "self_cuda_time_total" if self._cuda else "self_cpu_time_total"
        try:
            table = prof.key_averages().table(sort_by=sort, row_limit=TOP_ROWS)
            with open(summary, "w", encoding="utf-8") as fh:
                fh.write(f"{self._rounds} rounds in {time.monotonic() - self._started:.1f} s\n{table}\n")
        except Exception:
            log.exception("profiling: cannot write %s", summary)
            summary = ""
        log.info("profiling stopped after %d rounds: %s, %s (written in %.1f s)", self._rounds, trace or "no trace",
                 summary or "no summary", time.monotonic() - began)
        return trace, summary
