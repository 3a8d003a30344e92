"""The lower tiers, side by side in one run: tierd copies vs plain copies, and TTFT of resumes.

- demote + restore GB/s through a real tierd (shared-memory blocks, the
  engine's protocol) vs a warm numpy memcpy of the same bytes;
- KV-disk write and read of entries vs a raw sequential write and read of the
  same size (tierd's files carry a header and checksums);
- TTFT of a prompt resumed from KV-RAM and from KV-disk vs its cold TTFT, on
  the demo model with a pool small enough that retained entries must leave
  the device.

Last line: ``BENCH tiers ram_vs_memcpy=A disk_write_vs_raw=B disk_read_vs_raw=C
ram_ttft_vs_cold=D disk_ttft_vs_cold=E`` (throughput ratios tierd/plain, TTFT
ratios resumed/cold).

    python bench/tiers.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from checkout import use_checkout  # noqa: E402

ROOT = use_checkout()

import numpy as np  # noqa: E402

from ignis.engine.tiers.client import TierClient  # noqa: E402
from ignis.shared.demo.tokenizer import TOKENIZER_SIZE  # noqa: E402
from ignis.shared.shm_blocks import ShmBlock  # noqa: E402
from ignis.shared.tier_layout import UnitLayout  # noqa: E402
from tests.engine.engine_process import EngineProcess  # noqa: E402
from tests.engine.test_tiers_e2e import Tierd  # noqa: E402

PAGE_BYTES = 256 << 10


def copy_bench(rt: Path, pages: int, entries: int, disk: bool) -> tuple[float, float, float]:
    """(demote GB/s, restore GB/s, memcpy GB/s) for ``entries`` entries of ``pages`` pages each."""
    flags = ["--reuse-kv-host-pool-bytes", "64K", "--kv-disk-bytes", str(4 * pages * entries * PAGE_BYTES)] if disk \
        else ["--reuse-kv-host-pool-bytes", str(2 * pages * entries * PAGE_BYTES), "--kv-disk-bytes", "0"]
    tierd = Tierd(rt, *flags)
    kv = ShmBlock.create("kv", runs=1, items=pages * entries * 2, item_bytes=PAGE_BYTES)
    kv.array()[:] = np.random.default_rng(0).integers(0, 255, kv.array().shape, dtype=np.uint8)
    client = TierClient(tierd.endpoint, "bench-stamp", "qwen3_5", PAGE_BYTES, [kv.descriptor()],
                        UnitLayout(pages="kv", lane=(), image=None), timeout_s=120)
    try:
        assert client.connect()
        nbytes = pages * entries * PAGE_BYTES
        t0 = time.perf_counter()
        for e in range(entries):
            src = [("kv", e * pages + i) for i in range(pages)]
            assert client.demote(f"{e:032x}", src, "retained", "interactive", time.time()) is not None
        demote_s = time.perf_counter() - t0
        if disk:
            time.sleep(0.5)  # files are written on tierd's own threads after the ack
        t0 = time.perf_counter()
        base = pages * entries
        for e in range(entries):
            dst = [("kv", base + e * pages + i) for i in range(pages)]
            assert client.restore(f"{e:032x}", dst)
        restore_s = time.perf_counter() - t0
        arr = kv.array()[0]
        assert np.array_equal(arr[:base], arr[base:2 * base])
        buf = np.empty_like(arr[:base])
        np.copyto(buf, arr[:base])  # warm
        t0 = time.perf_counter()
        np.copyto(buf, arr[:base])
        memcpy_s = time.perf_counter() - t0
    finally:
        client.close()
        tierd.stop()
        kv.close()
    gb = nbytes / 1e9
    return gb / demote_s, gb / restore_s, gb / max(memcpy_s, 1e-9)


def raw_disk(directory: Path, nbytes: int) -> tuple[float, float]:
    data = os.urandom(nbytes)
    path = directory / "raw.bin"
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        f.read()
    read_s = time.perf_counter() - t0
    path.unlink()
    return nbytes / 1e9 / write_s, nbytes / 1e9 / read_s


def ttft_bench(rt: Path, disk: bool, prompt_len: int) -> tuple[float, float]:
    rng = random.Random(1)
    flags = ["--reuse-kv-host-pool-bytes", "64K", "--kv-disk-bytes", "256M"] if disk else \
        ["--reuse-kv-host-pool-bytes", "256M", "--kv-disk-bytes", "0"]
    tierd = Tierd(rt, *flags)
    pool = prompt_len + 128
    eng = EngineProcess(rt, "--tierd-endpoint", tierd.endpoint, "--kv-pool-tokens", str(pool), "--decode-lanes", "2",
                        "--restore-floor-kv-ram", "64", "--restore-floor-kv-disk", "64",
                        "--max-prefill-tokens-per-round", "4096")
    try:
        p = [rng.randrange(TOKENIZER_SIZE) for _ in range(prompt_len)]
        cold = eng.run("cold", p, timeout=600, max_tokens=1, opener_start=prompt_len - 3).finished
        filler = [rng.randrange(TOKENIZER_SIZE) for _ in range(pool - 64)]
        eng.run("fill", filler, timeout=600, max_tokens=1)
        warm = eng.run("warm", p, timeout=600, max_tokens=1, opener_start=prompt_len - 3).finished
        expected = "kv_disk" if disk else "kv_ram"
        if warm.reuse.tier != expected:
            raise RuntimeError(f"expected a resume from {expected}, got {warm.reuse.tier}: {eng.log_text()}")
        return cold.timings.ttft_ms, warm.timings.ttft_ms
    finally:
        eng.stop()
        tierd.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, for the test suite")
    args = ap.parse_args(argv)
    pages, entries, prompt_len = (16, 8, 4096) if not args.quick else (2, 2, 512)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ignis-tiers-") as tmp:
        tmp = Path(tmp)
        for sub in ("ram", "disk", "t-ram", "t-disk"):
            (tmp / sub).mkdir()
        d_ram, r_ram, memcpy = copy_bench(tmp / "ram", pages, entries, disk=False)
        d_disk, r_disk, _ = copy_bench(tmp / "disk", pages, entries, disk=True)
        raw_w, raw_r = raw_disk(tmp, pages * entries * PAGE_BYTES)
        cold_ram, warm_ram = ttft_bench(tmp / "t-ram", False, prompt_len)
        cold_disk, warm_disk = ttft_bench(tmp / "t-disk", True, prompt_len)
    rows += [("KV-RAM demote GB/s", d_ram), ("KV-RAM restore GB/s", r_ram), ("warm memcpy GB/s", memcpy),
             ("KV-disk demote GB/s", d_disk), ("KV-disk restore GB/s", r_disk),
             ("raw write GB/s", raw_w), ("raw read GB/s", raw_r),
             ("cold TTFT ms (ram run)", cold_ram), ("KV-RAM resume TTFT ms", warm_ram),
             ("cold TTFT ms (disk run)", cold_disk), ("KV-disk resume TTFT ms", warm_disk)]
    for name, value in rows:
        print(f"{name:<28}{value:>12.3f}")
    ram_copy = 2 / (1 / d_ram + 1 / r_ram)  # a demote and a restore of the same bytes
    print(f"BENCH tiers ram_vs_memcpy={ram_copy / memcpy:.3f} disk_write_vs_raw={d_disk / raw_w:.3f} "
          f"disk_read_vs_raw={r_disk / raw_r:.3f} ram_ttft_vs_cold={warm_ram / cold_ram:.3f} "
          f"disk_ttft_vs_cold={warm_disk / cold_disk:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
