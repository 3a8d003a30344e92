"""The engine <-> tierd copy path across two processes, on CUDA (or shared memory with ``--dry-run``).

The parent plays the engine: it allocates an exported KV pool
(``engine.device_memory.DeviceBlock`` on CUDA, a shared-memory
``HostBlock`` on the CPU) and a host-slot block (pinned shared memory on
CUDA), fills them with random bytes and describes them as tierd's ``Hello``
would. The child plays tierd with tierd's own pieces: it maps the blocks
(``EngineMemory``: CUDA IPC handle or shm name), locks and pins an
``Arena``, plans spans and runs the backend tierd would choose:

1. gather an entry (pages + one slot item) into the arena and report its
   SHA-256, which must equal the parent's hash of the same bytes;
2. scatter the arena's bytes, each XOR 0x5A, into other pages and another
   slot, which the parent checks byte for byte;
3. time ``--mib`` of pages out and back, against a torch copy of the same
   bytes between the device and pinned host memory in the parent.

No ZeroMQ, orjson or aiohttp is needed, so this runs on a bare CUDA image.
Last line: ``BENCH gpu_tiers ok=0|1 gather_gbps=A scatter_gbps=B torch_d2h_gbps=C torch_h2d_gbps=D``.

    python bench/gpu_tiers.py [--dry-run] [--mib 256]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time

from checkout import use_checkout  # noqa: E402

ROOT = use_checkout()

PAGE_BYTES = 1 << 16  # one run of one page
RUNS = 8


def _child(spec: dict) -> dict:
    """tierd's side: map, gather, hash, scatter the transformed bytes, time the bulk copies."""
    import numpy as np

    from ignis.shared.tier_layout import BlockDesc, UnitLayout
    from ignis.shared.wire_values import dataclass_from_json
    from ignis.tierd.arena import Arena
    from ignis.tierd.copier import make_backend, plan_spans
    from ignis.tierd.memory_map import EngineMemory

    blocks = tuple(dataclass_from_json(BlockDesc, b, f"blocks[{i}]") for i, b in enumerate(spec["blocks"]))
    memory = EngineMemory(blocks, UnitLayout(pages="kv", lane=("slot",), image=None))
    arena = Arena(spec["arena_bytes"], lock="try")
    try:
        if memory.uses_cuda:
            arena.pin_for_cuda()
        backend = make_backend(memory.cuda_device)
        block_bytes = spec["block_bytes"]
        out: dict = {}

        def spans_for(pages, slot):
            resolved = memory.resolve(tuple(("kv", p) for p in pages) + (("slot", slot),))
            need = -(-resolved.nbytes // block_bytes)
            return plan_spans(resolved.items, list(range(need)), block_bytes), resolved.nbytes

        spans, nbytes = spans_for(spec["src_pages"], spec["src_slot"])
        backend.gather(spans, arena.view)
        out["sha256"] = hashlib.sha256(arena.view[:nbytes].tobytes()).hexdigest()
        arena.view[:nbytes] ^= np.uint8(0x5A)
        spans, _ = spans_for(spec["dst_pages"], spec["dst_slot"])
        backend.scatter(spans, arena.view)

        bulk = memory.resolve(tuple(("kv", p) for p in spec["bulk_pages"]))
        need = -(-bulk.nbytes // block_bytes)
        bulk_spans = plan_spans(bulk.items, list(range(need)), block_bytes)
        for direction, fn in (("gather", backend.gather), ("scatter", backend.scatter)):
            fn(bulk_spans, arena.view)  # warm
            t0 = time.perf_counter()
            reps = 3
            for _ in range(reps):
                fn(bulk_spans, arena.view)
            out[f"{direction}_gbps"] = reps * bulk.nbytes / (time.perf_counter() - t0) / 1e9
        out["backend"] = type(backend).__name__
        out["locked_bytes"] = arena.locked_bytes
        return out
    finally:
        memory.close()
        arena.close()


def _torch_copy_gbps(src, reps: int = 3) -> tuple[float, float]:
    import torch

    if src.device.type != "cuda":
        return float("nan"), float("nan")
    host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
    out = []
    for a, b in ((host, src), (src, host)):
        a.copy_(b, non_blocking=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            a.copy_(b, non_blocking=True)
        torch.cuda.synchronize()
        out.append(reps * src.numel() * src.element_size() / (time.perf_counter() - t0) / 1e9)
    return out[0], out[1]


def run(device: str, mib: int) -> tuple[bool, dict]:
    """Parent (engine) side; returns (ok, figures)."""
    import torch

    from ignis.engine.host_memory import HostBlock
    from ignis.shared.tier_layout import BlockDesc
    from ignis.shared.wire_values import to_json

    pages = max(16, (mib << 20) // (RUNS * PAGE_BYTES))
    slots, slot_bytes = 4, 3 * 4096 + 17  # an odd item size: spans cut across arena blocks
    if device == "cuda":
        from ignis.engine.device_memory import DeviceBlock

        kv_block = DeviceBlock.create((RUNS, pages, PAGE_BYTES), torch.uint8, torch.device("cuda"))
        if kv_block is None:
            return False, {"error": "DeviceBlock.create failed (is cupy installed?)"}
        kv_desc = BlockDesc("kv", "cuda_ipc", kv_block.ipc_handle, RUNS, pages, PAGE_BYTES, pages * PAGE_BYTES,
                            device=kv_block.device)
    else:
        kv_block = HostBlock((RUNS, pages, PAGE_BYTES), torch.uint8, "cpu", "gpu-tiers-kv")
        kv_desc = BlockDesc("kv", "shm", kv_block.shm_name, RUNS, pages, PAGE_BYTES, pages * PAGE_BYTES)
    slot_block = HostBlock((1, slots, slot_bytes), torch.uint8, device, "gpu-tiers-slot")
    if slot_block.shm_name is None:
        return False, {"error": "the host-slot block could not be pinned shared memory"}
    slot_desc = BlockDesc("slot", "shm", slot_block.shm_name, 1, slots, slot_bytes, slots * slot_bytes)
    try:
        gen = torch.Generator(device="cpu").manual_seed(0)
        kv = kv_block.tensor
        kv.copy_(torch.randint(0, 256, kv.shape, dtype=torch.uint8, generator=gen))
        slot = slot_block.tensor
        slot.copy_(torch.randint(0, 256, slot.shape, dtype=torch.uint8, generator=gen))
        src_pages, dst_pages = [3, 0, 7], [9, 12, 5]
        spec = {"blocks": [to_json(kv_desc), to_json(slot_desc)], "block_bytes": 4 * PAGE_BYTES,
                "arena_bytes": (pages + 8) * RUNS * PAGE_BYTES, "src_pages": src_pages, "src_slot": 1,
                "dst_pages": dst_pages, "dst_slot": 2, "bulk_pages": list(range(pages))}
        if device == "cuda":
            torch.cuda.synchronize()
        entry = b"".join([kv[:, p, :].cpu().numpy().tobytes() for p in src_pages] + [slot[:, 1, :].numpy().tobytes()])
        want_sha = hashlib.sha256(entry).hexdigest()
        proc = subprocess.run([sys.executable, __file__, "--child"], input=json.dumps(spec), capture_output=True,
                              text=True, cwd=ROOT, timeout=300)
        if proc.returncode != 0:
            return False, {"error": f"child exited {proc.returncode}: {proc.stderr[-2000:]}"}
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        flipped = bytes(b ^ 0x5A for b in entry)
        back = b"".join([kv[:, p, :].cpu().numpy().tobytes() for p in dst_pages] + [slot[:, 2, :].numpy().tobytes()])
        figures = {k: got[k] for k in ("gather_gbps", "scatter_gbps", "backend", "locked_bytes")}
        figures["hash_ok"] = got["sha256"] == want_sha
        figures["scatter_ok"] = back == flipped
        figures["torch_d2h_gbps"], figures["torch_h2d_gbps"] = _torch_copy_gbps(kv)
        figures["bulk_mib"] = pages * RUNS * PAGE_BYTES >> 20
        return figures["hash_ok"] and figures["scatter_ok"], figures
    finally:
        slot_block.release()
        kv_block.release()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", "--quick", action="store_true", dest="dry_run",
                        help="CPU: shared-memory blocks and the numpy backend (checks the script itself)")
    parser.add_argument("--mib", type=int, default=256, help="bytes of pages timed out and back")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(json.loads(sys.stdin.read()))), flush=True)
        return 0
    device = "cpu" if args.dry_run else "cuda"
    ok, fig = run(device, 8 if args.dry_run else args.mib)
    for k, v in fig.items():
        print(f"{k:>16}  {v:.2f}" if isinstance(v, float) else f"{k:>16}  {v}", flush=True)
    keys = ("gather_gbps", "scatter_gbps", "torch_d2h_gbps", "torch_h2d_gbps")
    print("BENCH gpu_tiers ok=%d " % ok + " ".join(f"{k}={fig.get(k, float('nan')):.2f}" for k in keys), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
