"""Triton compiles after the warm-up are counted, timed and logged (kernels.compile_watch).

No compile happens on the CPU, so the hooks are driven two ways: through a
real ``JITFunction``'s own hook call in a fresh process without the
interpreter (the calling convention of this Triton), and directly.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

from ignis.kernels.compile_watch import CompileWatch

JIT_HOOK_CALL = textwrap.dedent("""
    import os
    os.environ.pop("TRITON_INTERPRET", None)
    from types import SimpleNamespace
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from ignis.kernels.compile_watch import CompileWatch

    @triton.jit
    def scale(x, n, B: tl.constexpr):
        pass

    watch = CompileWatch().install()
    assert watch.installed and type(scale).__name__ == "JITFunction"
    options = SimpleNamespace(num_warps=4, num_ctas=1, num_stages=2, enable_fp_fusion=True,
                              launch_cooperative_grid=False, extern_libs=())
    key, signature = ("k", (("*fp32", "D"), ("i32", "")), 0), {"x": "*fp32", "n": "i32"}
    runtime = triton.knobs.runtime
    for hook in (runtime.jit_cache_hook, runtime.jit_post_compile_hook):  # as Triton calls them around a compile
        scale._call_hook(hook, key, signature, GPUTarget("cuda", 90, 32), 0, {}, options, [{}], False)
    scale._call_hook(runtime.jit_post_compile_hook, key, signature, GPUTarget("cuda", 90, 32), 0, {}, options,
                     [{}], True)  # a manual warm-up compile is not counted
    print(dict(watch.counts))
    watch.uninstall()
    assert runtime.jit_cache_hook is None and runtime.jit_post_compile_hook is None
""")


def test_this_tritons_jit_calls_the_hooks_as_the_watch_takes_them(tmp_path):
    script = tmp_path / "jit_hook_call.py"  # a file: Triton reads a kernel's source
    script.write_text(JIT_HOOK_CALL)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "{'scale': 1}"
    assert "Triton compiled scale while serving" in out.stderr and "n: ('i32', '')" in out.stderr


def test_each_compile_is_counted_timed_and_logged(caplog):
    watch = CompileWatch()  # not installed: the hooks are called as Triton would
    fn = type("Info", (), {"name": "_prefill_kernel"})()
    with caplog.at_level(logging.WARNING, logger="ignis.kernels"):
        for key in ("a", "b"):
            watch.before_compile(key=key, fn=fn)
            watch.after_compile(key=key, repr="_prefill_kernel[...](s_pt_b: i32)", fn=fn)
        watch.after_compile(key="c", repr="warm", fn=fn, is_manual_warmup=True)
    assert watch.counts == {"_prefill_kernel": 2} and watch.seconds["_prefill_kernel"] >= 0
    assert sum("_prefill_kernel while serving" in r.getMessage() for r in caplog.records) == 2


def test_hooks_held_by_another_tool_are_left_alone(monkeypatch, caplog):
    import triton

    runtime = triton.knobs.runtime
    theirs = lambda **kwargs: None  # noqa: E731
    monkeypatch.setattr(runtime, "jit_cache_hook", theirs)
    with caplog.at_level(logging.WARNING, logger="ignis.kernels"):
        watch = CompileWatch().install()
    assert not watch.installed and runtime.jit_cache_hook is theirs
    assert "already set" in caplog.text


def test_a_triton_without_the_hooks_is_said_once(monkeypatch, caplog):
    import triton

    monkeypatch.delattr(triton, "knobs", raising=False)
    with caplog.at_level(logging.WARNING, logger="ignis.kernels"):
        watch = CompileWatch().install()
    assert not watch.installed and "no JIT compile hooks" in caplog.text
