"""A process's own watchdog (SGLang's ``--watchdog-timeout``): a loop stuck in one turn ends the process.

A round that never returns (a hung kernel or device sync, a deadlock) leaves
the engine's I/O thread answering Stats from its last snapshot, so the
gateway's health check still passes while no request moves; a gateway whose
event loop is stuck holds every connection open and answers nothing. A thread
of this module looks at the loop every second; once it has not turned for
``timeout_s`` seconds it logs a critical line, writes every thread's stack to
stderr (where the stuck call is) and aborts the process (SIGABRT, as
systemd's watchdog would), so whatever supervises it (``ignis serve``,
systemd's ``Restart=on-failure``) starts it again.

``stall()`` is the process's: seconds its loop has spent in the current turn
(the engine counts a model load only past its grace, ``engine.server``; the
gateway's is its ``LoopBeat``'s age).

``StopDeadline`` bounds a stop: once a process has begun stopping (SIGTERM),
one that has not exited within its deadline (its own graceful budget plus a
margin) logs a critical line and every thread's stack and exits with status 1,
so a stuck stop is a failed stop with its cause in the log rather than a
process that lingers until systemd's SIGKILL.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
from collections.abc import Callable

log = logging.getLogger("ignis")

CHECK_EVERY_S = 1.0


def _log_critical(message: str) -> None:
    log.critical(message)
    for handler in logging.getLogger().handlers:
        handler.flush()


def abort_process(message: str) -> None:
    """Log ``message``, every thread's stack, and abort."""
    _log_critical(message)
    if not faulthandler.is_enabled():  # enabled (shared.logs): the abort itself writes the stacks
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    os.abort()


def exit_stuck(message: str) -> None:
    """Log ``message``, every thread's stack, and exit with status 1 at once (no cleanup: it is stuck)."""
    _log_critical(message)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    os._exit(1)


class LoopWatchdog:
    def __init__(self, timeout_s: float, stall: Callable[[], float], what: str = "engine loop",
                 abort: Callable[[str], None] = abort_process, every_s: float = CHECK_EVERY_S):
        self.timeout_s = timeout_s
        self.what = what
        self._stall = stall
        self._abort = abort
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loop-watchdog", daemon=True)

    def start(self) -> LoopWatchdog:
        """Watch, unless the timeout is 0 (off)."""
        if self.timeout_s > 0:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def check(self) -> bool:
        """Whether the loop is stuck now (and the process was told to abort)."""
        stall = self._stall()
        if stall < self.timeout_s:
            return False
        self._abort(f"the {self.what} has been in one turn for {stall:.0f} s (--watchdog-timeout "
                    f"{self.timeout_s:g}): it is stuck (a hung kernel, device sync, read or lock); aborting so the "
                    f"supervisor restarts the process. Every thread's stack follows.")
        return True

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            if self.check():
                return


class StopDeadline:
    """Started when a stop begins: after ``deadline_s`` seconds the process is still here, so it is stuck."""

    def __init__(self, deadline_s: float, what: str, exit: Callable[[str], None] = exit_stuck):
        self.deadline_s = deadline_s
        self.what = what
        self._exit = exit
        self._timer = threading.Timer(deadline_s, self._expired)
        self._timer.daemon = True
        self._timer.name = "stop-deadline"

    def start(self) -> StopDeadline:
        self._timer.start()
        return self

    def cancel(self) -> None:
        self._timer.cancel()

    def _expired(self) -> None:
        self._exit(f"the {self.what} has not stopped {self.deadline_s:g} s after it was told to (its graceful "
                   f"shutdown is bounded below that): something in its stop is stuck (a request handler, a thread, "
                   f"a socket); exiting with status 1. Every thread's stack follows.")
