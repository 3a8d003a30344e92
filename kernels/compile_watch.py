"""Triton compiles after the warm-up: counted, timed and logged, never silent.

Triton compiles a kernel the first time a process launches it with a new
specialisation of its arguments. The engine's warm-up compiles every variant
a round should meet (tests/kernels/test_kernel_variants.py checks that on the
CPU); a variant it missed is compiled when a request first needs it, on the
serving loop, and every lane waits for it (seconds at the 27B's shapes; the
first burst after a start once ran at 54 tokens/s against 1,015 later).

``CompileWatch.install()`` hooks Triton's JIT (``triton.knobs.runtime``'s
``jit_cache_hook``, called before a compile, and ``jit_post_compile_hook``,
after it) once the warm-up is done: each compile from then on is counted by
kernel name in ``counts`` with its seconds in ``seconds``, and logged as a
warning naming the kernel and its argument types. A Triton without those
hooks, or hooks another tool already holds, is said once in the log and
nothing is counted (``installed`` False). The hooks run on the thread that
launches the kernel: the engine loop.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

log = logging.getLogger("ignis.kernels")


class CompileWatch:
    def __init__(self):
        self.counts: Counter = Counter()
        self.seconds: Counter = Counter()
        self.installed = False
        self._started: dict[object, float] = {}
        self._runtime = None

    def install(self) -> CompileWatch:
        """Hook Triton's JIT from now on; a no-op (said in the log) where the hooks are missing or taken."""
        try:
            import triton
        except ImportError:
            return self
        runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
        if runtime is None or not hasattr(runtime, "jit_cache_hook") or not hasattr(runtime, "jit_post_compile_hook"):
            log.warning("this Triton (%s) has no JIT compile hooks: compiles after the warm-up are not counted",
                        getattr(triton, "__version__", "?"))
            return self
        if runtime.jit_cache_hook is not None or runtime.jit_post_compile_hook is not None:
            log.warning("Triton's JIT compile hooks are already set: compiles after the warm-up are not counted")
            return self
        runtime.jit_cache_hook = self.before_compile
        runtime.jit_post_compile_hook = self.after_compile
        self._runtime = runtime
        self.installed = True
        return self

    def uninstall(self) -> None:
        if self._runtime is not None:
            if self._runtime.jit_cache_hook == self.before_compile:
                self._runtime.jit_cache_hook = None
            if self._runtime.jit_post_compile_hook == self.after_compile:
                self._runtime.jit_post_compile_hook = None
            self._runtime = None
        self.installed = False

    def before_compile(self, *, key, fn, is_manual_warmup=False, **_kwargs):
        """Triton's ``jit_cache_hook``: a compile starts. Returns None (the compile goes ahead)."""
        if not is_manual_warmup:
            self._started[_hashable(key)] = time.perf_counter()
        return None

    def after_compile(self, *, key, repr, fn, is_manual_warmup=False, **_kwargs):
        """Triton's ``jit_post_compile_hook``: a compile ended; counted, timed and logged."""
        if is_manual_warmup:
            return None
        started = self._started.pop(_hashable(key), None)
        seconds = time.perf_counter() - started if started is not None else 0.0
        name = getattr(fn, "name", None) or str(fn)
        self.counts[name] += 1
        self.seconds[name] += seconds
        log.warning("Triton compiled %s while serving, in %.2f s (a variant the warm-up did not compile: every lane "
                    "waited for it): %s", name, seconds, repr)
        return None


def _hashable(key) -> object:
    try:
        hash(key)
        return key
    except TypeError:
        return repr(key)
