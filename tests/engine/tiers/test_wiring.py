"""What the engine exports to tierd, and how its tier port names what moves.

Block descriptors of shared host memory and of CUDA IPC allocations; the
port's page and slot references, and the keys of live parts.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
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


@pytest.mark.parametrize("window", [0, 16])
def test_an_hq_pool_exports_its_window_slots_only_when_it_keeps_a_window(window):
    """``--kv-format hq-e8-2b --kv-exact-window 0``: no window to keep, and the tiers stay on (a
    zero-size window block has no shared memory, and was taken for a slot tierd cannot map)."""
    from ignis.shared.demo import ensure_demo_model
    from ignis.engine.models.config import load_config
    from ignis.engine.models.state import ModelState

    cfg = load_config(ensure_demo_model())
    state = ModelState.allocate(cfg, num_pages=8, lanes=2, dtype=torch.float32, shared=True, kv_format="hq-e8-2b",
                                exact_window=window)
    state.allocate_slots(device_slots=0, host_slots=3)
    try:
        blocks, unit = exported_blocks(state)
        expected = ("slot_ssm", "slot_conv") + (("slot_window",) if window else ())
        assert unit.lane == expected and [b.kind for b in blocks] == ["shm"] * (1 + len(expected))
    finally:
        state.close()


class RecordingClient:
    """A TierClient's calls, recorded; every copy succeeds in KV-RAM at once (plain values: the port
    turns them into done handles)."""

    def __init__(self):
        self.unit = SimpleNamespace(lane=("slot_ssm", "slot_conv"))
        self.connects = 1
        self.calls = []

    def demote(self, key, source, kind, request_class, last_used):
        self.calls.append(("demote", key, source, kind))
        return "ram"

    def restore(self, key, dest, skip=0):
        self.calls.append(("restore", key, dest) + ((skip,) if skip else ()))
        return "ram"

    def drop(self, key):
        self.calls.append(("drop", key))


def test_the_port_names_pages_and_host_slot_items_and_never_exports_a_device_slot():
    from ignis.engine.reuse.lower_index import content_key
    from ignis.engine.tiers.wiring import TierClientPort

    client = RecordingClient()
    saved = []
    state = SimpleNamespace(save_image=lambda lane, slot: saved.append((lane, slot)))
    port = TierClientPort(client, state, device_slots=2, staging_slot=6)
    assert port.session == 1
    client.connects += 1  # a new hello
    assert port.session == 2
    assert port.demote_retained((1, 2, 3), [4, 5], slot=1, request_class="agent") is None  # a device slot
    assert port.restore_retained("k", [4, 5], slot=0) is None
    assert client.calls == []
    assert port.demote_retained((1, 2, 3), [4, 5], slot=3, request_class="agent").value == "ram"
    assert client.calls[-1] == ("demote", content_key((1, 2, 3)),
                                [("kv", 4), ("kv", 5), ("slot_ssm", 1), ("slot_conv", 1)], "retained")
    assert port.restore_retained("k", [7], slot=2).value == "ram"
    assert client.calls[-1] == ("restore", "k", [("kv", 7), ("slot_ssm", 0), ("slot_conv", 0)])
    assert port.restore_retained("k", [8], slot=2, skip=3).value == "ram"  # pages 0..2 shared on the device
    assert client.calls[-1] == ("restore", "k", [("kv", 8), ("slot_ssm", 0), ("slot_conv", 0)], 3)
    assert port.demote_window("r", 0, [8, 9], "agent").ok and port.demote_image("r", lane=1, request_class="agent").ok
    assert saved == [(1, 6)]  # the image is staged in the staging slot before it moves
    window, image = client.calls[-2:]
    assert window[2:] == ([("kv", 8), ("kv", 9)], "live") and image[2:] == ([("slot_ssm", 4), ("slot_conv", 4)], "live")
    assert port.restore_window("r", 0, [10, 11]).ok and port.restore_image("r").ok
    assert [c[1] for c in client.calls[-2:]] == [window[1], image[1]]  # the same keys come back
    port.drop_window("r", 0)
    port.drop_image("r")
    assert client.calls[-2:] == [("drop", window[1]), ("drop", image[1])]


def test_a_port_without_a_staging_slot_moves_no_live_image():
    from ignis.engine.tiers.wiring import TierClientPort

    client = RecordingClient()
    port = TierClientPort(client, SimpleNamespace(), device_slots=0, staging_slot=None)
    assert not port.demote_image("r", 0, "agent") and not port.restore_image("r")
    assert client.calls == []


def test_the_tierd_timeout_flags_are_checked():
    import pytest

    from ignis.engine.config import EngineConfig

    assert (EngineConfig().tierd_timeout, EngineConfig().tierd_retry_interval) == (10.0, 5.0)
    for bad in ({"tierd_timeout": 0}, {"tierd_retry_interval": -1.0}, {"tierd_timeout": float("nan")}):
        with pytest.raises(ValueError, match="--tierd-"):
            EngineConfig(**bad)
