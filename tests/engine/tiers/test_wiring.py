"""What the engine exports to tierd: block descriptors of shared host memory and of CUDA IPC allocations."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ignis.engine.tiers.wiring import _device_sync, exported_blocks


def fake_state(kv_block, host_blocks, device="cpu"):
    return SimpleNamespace(kv_block=kv_block, host_blocks=host_blocks, ssm=torch.zeros(1, device=device))


def host_block(shape, name, dtype=torch.float32):
    return SimpleNamespace(shape=shape, tensor=torch.zeros((), dtype=dtype), shm_name=name)


def test_a_cuda_pool_is_described_by_its_ipc_handle_and_device():
    # [full layers, 2, pages, 64, kv heads, head dim] in bf16; handle of the pool's own allocation
    kv = SimpleNamespace(shape=(3, 2, 10, 64, 2, 8), tensor=torch.zeros((), dtype=torch.bfloat16),
                         ipc_handle="ab" * 64, device=1, shm_name=None)
    ssm = host_block((4, 5, 2, 8, 8), "ignis-1-0-slots-ssm")
    conv = host_block((4, 5, 96, 3), "ignis-1-1-slots-conv", torch.bfloat16)
    blocks, unit = exported_blocks(fake_state(kv, (ssm, conv)))
    d_kv, d_ssm, d_conv = blocks
    assert (d_kv.kind, d_kv.handle, d_kv.device) == ("cuda_ipc", "ab" * 64, 1)
    assert (d_kv.runs, d_kv.items, d_kv.item_bytes) == (6, 10, 64 * 2 * 8 * 2)
    assert d_kv.run_stride_bytes == 10 * d_kv.item_bytes
    assert (d_ssm.kind, d_ssm.handle, d_ssm.runs, d_ssm.items, d_ssm.item_bytes) == (
        "shm", "ignis-1-0-slots-ssm", 4, 5, 2 * 8 * 8 * 4)
    assert (d_conv.kind, d_conv.runs, d_conv.items, d_conv.item_bytes) == ("shm", 4, 5, 96 * 3 * 2)
    assert unit.pages == "kv" and unit.lane == ("slot_ssm", "slot_conv")


def test_nothing_is_exported_when_a_block_cannot_be_shared():
    kv = SimpleNamespace(shape=(1, 2, 4, 64, 1, 8), tensor=torch.zeros(()), ipc_handle=None, shm_name=None)
    ssm = host_block((1, 2, 1, 8, 8), "ignis-1-0-slots-ssm")
    assert exported_blocks(fake_state(kv, (ssm,))) is None  # a plain device pool (no cupy)
    shared_kv = host_block((1, 2, 4, 64, 1, 8), "ignis-1-9-kv")
    assert exported_blocks(fake_state(shared_kv, (host_block((1, 2, 1, 8, 8), None),))) is None  # unpinned slot
    assert exported_blocks(fake_state(shared_kv, ())) is None


def test_a_real_cpu_state_exports_shared_memory_and_needs_no_sync():
    from ignis.shared.demo import ensure_demo_model
    from ignis.engine.models.config import load_config
    from ignis.engine.models.state import ModelState

    cfg = load_config(ensure_demo_model())
    state = ModelState.allocate(cfg, num_pages=8, lanes=2, dtype=torch.float32, shared=True)
    state.allocate_slots(device_slots=1, host_slots=3)
    try:
        blocks, _unit = exported_blocks(state)
        assert [b.kind for b in blocks] == ["shm"] * 3
        assert blocks[0].items == 8 and blocks[1].items == 3
        assert _device_sync(state) is None
    finally:
        state.close()
