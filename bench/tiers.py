"""The lower tiers, side by side in one run: tierd copies vs plain copies, and TTFT of resumes.

- demote + restore GB/s through a real tierd (shared-memory blocks in the
  layout of a Flash-Next KV page, the engine's protocol) vs a numpy memcpy of
  the same bytes (one thread, warm target);
- KV-disk write and read of entries vs a raw sequential write and read of
  files of the same sizes, with the same flags (O_DIRECT where the directory
  takes it, no fsync: tierd's policy), both read cold (page cache dropped
  with POSIX_FADV_DONTNEED); tierd's files also carry a header and a MAC;
- TTFT of a prompt resumed from KV-RAM and from KV-disk vs its cold TTFT, on
  the demo model with a pool small enough that retained entries must leave
  the device.

Last line: ``BENCH tiers ram_vs_memcpy=A disk_write_vs_raw=B disk_read_vs_raw=C
ram_ttft_vs_cold=D disk_ttft_vs_cold=E`` (throughput ratios tierd/plain, each
the median over rounds of a round's tierd copies against the plain copies run
right after them, so both sides see the same load; TTFT ratios resumed/cold).

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

use_checkout()

import numpy as np  # noqa: E402

from ignis.engine.tiers.client import TierClient  # noqa: E402
from ignis.shared.demo.tokenizer import TOKENIZER_SIZE  # noqa: E402
from ignis.shared.shm_blocks import ShmBlock  # noqa: E402
from ignis.shared.tier_layout import UnitLayout  # noqa: E402
from ignis.tierd import disk as kvdisk  # noqa: E402
from ignis.tierd import disk_io as kvdisk_io  # noqa: E402
from tests.engine.engine_process import EngineProcess  # noqa: E402
from tests.engine.test_tiers_e2e import Tierd  # noqa: E402

RUNS, ITEM_BYTES = 24, 64 << 10
"""The KV block's layout: a Flash-Next page (12 full-attention layers x K,V = 24 runs of 64 tokens x 2 heads
x 256 x bf16 = 64 KiB), 1.5 MiB a page."""


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def copy_bench(rt: Path, layout: tuple[int, int], pages: int, entries: int, rounds: int,
               disk: bool) -> list[tuple[float, float, float, float]]:
    """Seconds per round of (demote, restore, plain write, plain read) for ``entries`` entries of ``pages``
    pages each. The plain side runs in the same round, on the same bytes: two one-thread numpy memcpys
    (KV-RAM), or a raw write and a cold read of files of the entries' sizes (KV-disk, ``raw_disk``)."""
    runs, item_bytes = layout
    page = runs * item_bytes
    nbytes = pages * entries * page
    flags = ["--reuse-kv-host-pool-bytes", "64K", "--kv-disk-bytes", str(4 * nbytes)] if disk \
        else ["--reuse-kv-host-pool-bytes", str(2 * nbytes), "--kv-disk-bytes", "0"]
    tierd = Tierd(rt, *flags)
    kv = ShmBlock.create("kv", runs=runs, items=pages * entries * 2, item_bytes=item_bytes)
    kv.array()[:] = np.random.default_rng(0).integers(0, 255, kv.array().shape, dtype=np.uint8)
    client = TierClient(tierd.endpoint, "bench-stamp", "qwen3_5", page, [kv.descriptor()],
                        UnitLayout(pages="kv", lane=(), image=None), timeout_s=120)
    flat = kv.array().reshape(-1)
    buf = np.empty(nbytes, dtype=np.uint8)
    direct = kvdisk_io.direct_io_works(rt)
    out = []
    try:
        assert client.connect()
        base = pages * entries
        for r in range(rounds):
            t0 = time.perf_counter()
            ops = [client.demote(f"{r}{e:031x}", [("kv", e * pages + i) for i in range(pages)], "retained",
                                 "interactive", time.time()) for e in range(entries)]
            assert all(client.wait(op).ok for op in ops), ops  # posted together, as the engine posts a round's
            demote = time.perf_counter() - t0
            if disk:
                drop_cache(rt / "default-kv-disk")
            t0 = time.perf_counter()
            ops = [client.restore(f"{r}{e:031x}", [("kv", base + e * pages + i) for i in range(pages)])
                   for e in range(entries)]
            assert all(client.wait(op).ok for op in ops), ops
            restore = time.perf_counter() - t0
            arr = kv.array()
            assert np.array_equal(arr[:, :base], arr[:, base:2 * base])
            arr[:, base:] = 0
            for op in [client.drop(f"{r}{e:031x}") for e in range(entries)]:
                client.wait(op)
            if disk:
                plain = raw_disk(rt, nbytes, entries, direct)
            else:
                np.copyto(buf, flat[:nbytes])  # the first warms the target
                plain = []
                for _ in range(2):
                    t0 = time.perf_counter()
                    np.copyto(buf, flat[:nbytes])
                    plain.append(time.perf_counter() - t0)
            out.append((demote, restore, *plain))
    finally:
        client.close()
        tierd.stop()
        kv.close()
    return out


def drop_cache(directory: Path) -> None:
    """Drop ``directory``'s files from the page cache, so a read goes to the disk."""
    for path in directory.glob("*.kv*"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def raw_disk(directory: Path, nbytes: int, entries: int, direct: bool) -> tuple[float, float]:
    """Seconds to write and to read ``entries`` plain files of ``nbytes / entries``, sequentially in
    KV-disk chunks from one aligned buffer, with the flags tierd's files get (O_DIRECT or not, no
    fsync), dropped from the page cache before the read."""
    size = nbytes // entries
    data = kvdisk_io.aligned_buffer(size)
    data[:] = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8)
    flag = os.O_DIRECT if direct else 0
    chunk = kvdisk.CHUNK_BYTES
    paths = [directory / f"raw-{e}.bin" for e in range(entries)]
    t0 = time.perf_counter()
    for path in paths:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o600)
        for at in range(0, size, chunk):
            os.pwrite(fd, data[at:at + chunk], at)
        os.close(fd)
    write = time.perf_counter() - t0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    t0 = time.perf_counter()
    for path in paths:
        fd = os.open(path, os.O_RDONLY | flag)
        for at in range(0, size, chunk):
            os.preadv(fd, [data[at:at + chunk]], at)
        os.close(fd)
    read = time.perf_counter() - t0
    for path in paths:
        path.unlink()
    return write, read


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
    if args.quick:
        layout, pages, entries, rounds, prompt_len = (4, 16 << 10), 2, 2, 1, 512
    else:
        layout, pages, entries, rounds, prompt_len = (RUNS, ITEM_BYTES), 32, 4, 5, 4096
    nbytes = pages * entries * layout[0] * layout[1]
    with tempfile.TemporaryDirectory(prefix="ignis-tiers-", dir=os.environ.get("IGNIS_BENCH_DIR")) as tmp:
        tmp = Path(tmp)
        for sub in ("ram", "disk", "t-ram", "t-disk"):
            (tmp / sub).mkdir()
        direct = kvdisk_io.direct_io_works(tmp)
        ram = copy_bench(tmp / "ram", layout, pages, entries, rounds, disk=False)
        disk = copy_bench(tmp / "disk", layout, pages, entries, rounds, disk=True)
        cold_ram, warm_ram = ttft_bench(tmp / "t-ram", False, prompt_len)
        cold_disk, warm_disk = ttft_bench(tmp / "t-disk", True, prompt_len)
    print(f"{entries} entries of {pages} pages of {layout[0]} x {layout[1] >> 10} KiB ({nbytes / 2**20:.0f} MiB), "
          f"{rounds} rounds, each against its plain copies run in the same round; disk files "
          f"{'O_DIRECT' if direct else 'buffered'}, no fsync, cold reads")
    gbps = [[nbytes / 1e9 / t for t in col] for col in zip(*ram)] + [[nbytes / 1e9 / t for t in col]
                                                                    for col in zip(*disk)]
    names = ["KV-RAM demote", "KV-RAM restore", "memcpy", "memcpy (again)", "KV-disk demote", "KV-disk restore",
             "raw write", "raw read"]
    for name, col in zip(names, gbps):
        print(f"{name + ' GB/s':<28}{median(col):>12.3f}   (rounds: {', '.join(f'{x:.2f}' for x in col)})")
    for name, value in [("cold TTFT ms (ram run)", cold_ram), ("KV-RAM resume TTFT ms", warm_ram),
                        ("cold TTFT ms (disk run)", cold_disk), ("KV-disk resume TTFT ms", warm_disk)]:
        print(f"{name:<28}{value:>12.3f}")
    # a demote and a restore of the same bytes against two memcpys of them, round by round
    ram_ratio = median([(m1 + m2) / (d + r) for d, r, m1, m2 in ram])
    write_ratio = median([w / d for d, _, w, _ in disk])
    read_ratio = median([rd / r for _, r, _, rd in disk])
    # three significant digits, not three decimals: quick mode's copies are so small that a loaded machine's
    # message latency can put a ratio under 0.0005, which is not zero
    print(f"BENCH tiers ram_vs_memcpy={ram_ratio:.3g} disk_write_vs_raw={write_ratio:.3g} "
          f"disk_read_vs_raw={read_ratio:.3g} ram_ttft_vs_cold={warm_ram / cold_ram:.3g} "
          f"disk_ttft_vs_cold={warm_disk / cold_disk:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
