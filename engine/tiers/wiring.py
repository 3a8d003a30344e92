"""Connect the retained store to tierd: export the engine's blocks, install the demote/fetch hooks.

Blocks tierd maps (host blocks: named POSIX shared memory, pinned on CUDA;
the KV pool on CUDA: a CUDA IPC handle of its own allocation)::

    kv         the KV pool, one item per page   runs = 2 x full layers
    slot_ssm   host retained slots, recurrent   runs = linear layers, one item per slot
    slot_conv  host retained slots, conv        runs = linear layers
    slot_window  (hq-e8-2b) host slots, exact window   runs = full layers

A demoted entry is its pages (in order) plus one item of each slot block:
the image of a host slot. Only entries whose image sits in a host slot move
down; a device-slot image is not exported. Keys are content hashes of the
entry's tokens.
"""

from __future__ import annotations

import logging
import time

from ignis.engine.reuse.store import RetainedStore
from ignis.engine.tiers.client import TierClient
from ignis.engine.reuse.lower_index import LowerIndex, content_key
from ignis.shared.tier_layout import BlockDesc, UnitLayout

log = logging.getLogger("ignis.engine.tiers")


def _handle(block) -> tuple[str, str, int] | None:
    """(kind, handle, device) of a HostBlock or DeviceBlock; None when it is not shareable."""
    if getattr(block, "shm_name", None):
        return "shm", block.shm_name, 0
    if getattr(block, "ipc_handle", None):
        return "cuda_ipc", block.ipc_handle, block.device
    return None


def _desc(name: str, block, runs: int) -> BlockDesc:
    shape = block.shape
    items = shape[1] if runs == shape[0] else shape[2]
    elem = block.tensor.element_size()
    total = 1
    for s in shape:
        total *= s
    item_bytes = total * elem // (runs * items)
    kind, handle, device = _handle(block)
    return BlockDesc(name=name, kind=kind, handle=handle, runs=runs, items=items,
                     item_bytes=item_bytes, run_stride_bytes=items * item_bytes, device=device)


def exported_blocks(state) -> tuple[list[BlockDesc], UnitLayout] | None:
    """Block descriptors of a ModelState whose pool and host slots tierd can map; None otherwise."""
    kv_block = getattr(state, "kv_block", None)
    if kv_block is None or _handle(kv_block) is None or not state.host_blocks:
        return None
    if any(_handle(b) is None for b in state.host_blocks):
        return None
    full = kv_block.shape[0]
    blocks = [_desc("kv", kv_block, runs=2 * full)]
    names = []
    for block, name in zip(state.host_blocks, ("slot_ssm", "slot_conv", "slot_window")):
        blocks.append(_desc(name, block, runs=block.shape[0]))
        names.append(name)
    return blocks, UnitLayout(pages="kv", lane=tuple(names), image=None)


def _device_sync(state):
    """A function that waits for the engine's queued CUDA work, or None on the CPU."""
    device = state.ssm.device
    if device.type != "cuda":
        return None
    import torch  # noqa: PLC0415 - the engine has it loaded already

    return lambda: torch.cuda.synchronize(device)


def attach_tiers(store: RetainedStore, state, endpoint: str, stamp: str, family: str,
                 floors: dict[str, int], timeout_s: float = 10.0) -> TierClient | None:
    """Wire ``store`` to the tierd at ``endpoint``; None (lower tiers off) when memory cannot be shared."""
    exported = exported_blocks(state)
    if exported is None:
        log.warning("lower tiers off: the KV pool or the host slots cannot be shared with tierd on this device")
        return None
    blocks, unit = exported
    page_bytes = blocks[0].item_bytes * blocks[0].runs
    client = TierClient(endpoint, stamp, family, max(4096, page_bytes), blocks, unit, timeout_s=timeout_s,
                        sync=_device_sync(state))
    device_slots = store.slots.device_slots
    lane_blocks = unit.lane

    def refs(pages, slot):
        return [("kv", int(p)) for p in pages] + [(name, slot - device_slots) for name in lane_blocks]

    def demote(entry):
        if store.slots.tier_of(entry.slot) != "host":
            return None
        return client.demote(content_key(entry.tokens), refs(entry.pages.pages, entry.slot),
                             kind="retained", request_class=entry.request_class, last_used=time.time())

    def fetch(record, pages, slot):
        if store.slots.tier_of(slot) != "host":
            return None
        return client.restore(record.key, refs(pages, slot))

    store.lower = LowerIndex(floors)
    store.demote_hook = demote
    store.fetch_hook = fetch
    store.locate_hook = client.lookup
    client.lane_blocks = lane_blocks
    client.on_connect = store.lower.clear  # a hello drops everything tierd held for us
    if not client.connect():
        log.warning("tierd at %s is not answering yet; the engine will retry", endpoint)
    return client


class TierEvictionHooks:
    """Live eviction through tierd: page windows and the staged image as "live" entries."""

    def __init__(self, client: TierClient, state, staging_slot: int, device_slots: int, lane_blocks):
        self.client = client
        self.state = state
        self.staging = staging_slot
        self.staging_index = staging_slot - device_slots
        self.lane_blocks = tuple(lane_blocks)

    @staticmethod
    def _key(req_id: str, part: str) -> str:
        return content_key(tuple(f"live:{req_id}:{part}".encode()))

    def demote_pages(self, req_id, index, pages, request_class) -> bool:
        refs = [("kv", int(p)) for p in pages]
        return self.client.demote(self._key(req_id, f"w{index}"), refs, kind="live", request_class=request_class,
                                  last_used=time.time()) is not None

    def demote_image(self, req_id, lane, request_class) -> bool:
        self.state.save_image(lane, self.staging)
        refs = [(name, self.staging_index) for name in self.lane_blocks]
        return self.client.demote(self._key(req_id, "image"), refs, kind="live", request_class=request_class,
                                  last_used=time.time()) is not None

    def restore(self, req_id, record, pages) -> bool:
        at = 0
        for i, window in enumerate(record.windows):
            dest = [("kv", int(p)) for p in pages[at:at + len(window)]]
            if not self.client.restore(self._key(req_id, f"w{i}"), dest):
                return False
            at += len(window)
        refs = [(name, self.staging_index) for name in self.lane_blocks]
        return self.client.restore(self._key(req_id, "image"), refs)

    def drop(self, req_id, record) -> None:
        for i in range(len(record.windows)):
            self.client.drop(self._key(req_id, f"w{i}"))
        if record.image:
            self.client.drop(self._key(req_id, "image"))
