"""The engine's ``TierPort`` over a ``TierClient``: the blocks it exports to tierd, and its entries there.

Blocks tierd maps (host blocks: named POSIX shared memory, pinned on CUDA;
the KV pool on CUDA: a CUDA IPC handle of its own allocation)::

    kv         the KV pool, one item per page   runs = 2 x full layers
    slot_ssm   host retained slots, recurrent   runs = linear layers, one item per slot
    slot_conv  host retained slots, conv        runs = linear layers
    slot_window  (hq-e8-2b) host slots, exact window   runs = full layers

A demoted retained entry is its pages (in order) plus one item of each slot
block: the image of a host slot. Only entries whose image sits in a host slot
move down; a device-slot image is not exported. The store keys them by
content (a hash of the entry's tokens). A live sequence moves as one
"live" entry per page window and one for its state image, staged in the
reserved host slot; those keys hash the request id and the part.

Every copy is posted and returns a handle (``engine.tier_ops.TierOp``); the
scheduler's ``poll`` completes them (``engine.tiers.client``).

Restored bytes are checked before use (``check_restored``: finite KV rows and
image, ``engine.tiers.restore_check``); the store and the evictor drop what
fails and recompute.
"""

from __future__ import annotations

import logging
import time

from ignis.engine.reuse.lower_index import content_key
from ignis.engine.tier_ops import TierOp, as_op
from ignis.engine.tiers.client import TierClient
from ignis.engine.tiers.restore_check import (
    FAULT_NAN_RESTORE_ENV,
    fault_nan_restores,
    finite_image,
    finite_pages,
    poison_image,
)
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


def connect_tiers(state, endpoint: str, stamp: str, family: str, device_slots: int, staging_slot: int | None,
                  timeout_s: float = 10.0, engine_id: str = "default", backoff_s: float = 5.0) -> TierClientPort | None:
    """A port to the tierd at ``endpoint`` for ``state``'s blocks, hello said (or to be retried);
    None (lower tiers off) when the memory cannot be shared."""
    exported = exported_blocks(state)
    if exported is None:
        log.warning("lower tiers off: the KV pool or the host slots cannot be shared with tierd on this device")
        return None
    blocks, unit = exported
    page_bytes = blocks[0].item_bytes * blocks[0].runs
    client = TierClient(endpoint, stamp, family, max(4096, page_bytes), blocks, unit, timeout_s=timeout_s,
                        backoff_s=backoff_s, sync=_device_sync(state), engine_id=engine_id)
    if not client.connect():
        log.warning("tierd at %s is not answering yet; the engine will retry", endpoint)
    poison = fault_nan_restores()
    if poison:
        log.warning("FAULT INJECTION: %s=%d writes NaN into the next %d restored state images (for tests only)",
                    FAULT_NAN_RESTORE_ENV, poison, poison)
    return TierClientPort(client, state, device_slots, staging_slot, poison_restores=poison)


class TierClientPort:
    """Retained entries and live sequences as tierd entries, through ``client``; every copy is posted
    and answered by a handle (``engine.tier_ops.TierOp``) that ``poll`` completes.

    ``device_slots``: retained slots below this id are on the device (never
    exported); host slot ``s`` is item ``s - device_slots`` of each slot block.
    ``staging_slot``: the host slot live images pass through (None: no live
    eviction through this port). ``poison_restores`` (tests only): the next N restored
    images get a NaN written into them (``restore_check.FAULT_NAN_RESTORE_ENV``)."""

    def __init__(self, client: TierClient, state, device_slots: int, staging_slot: int | None,
                 poison_restores: int = 0):
        if staging_slot is not None and staging_slot < device_slots:
            raise ValueError(f"the staging slot {staging_slot} must be a host slot (ids from {device_slots})")
        self.client = client
        self.state = state
        self.device_slots = device_slots
        self.staging_slot = staging_slot
        self.lane_blocks = tuple(client.unit.lane)
        self.poison_restores = poison_restores

    @property
    def session(self) -> int:
        return self.client.connects

    @property
    def live_on_disk(self) -> bool:
        welcome = self.client.welcome
        return welcome is not None and welcome.disk_bytes > 0

    def poll(self, wait_s: float = 0.0) -> int:
        return self.client.poll(wait_s)

    def renew(self) -> bool:
        if self.client.in_flight:
            raise RuntimeError("renew needs no exchange with tierd in flight")
        if self.client.welcome is None:
            return False  # tierd is away: the hello that finds it again starts an empty session
        return self.client.connect()

    @property
    def in_flight(self) -> int:
        return self.client.in_flight

    def _slot_refs(self, slot: int) -> list[tuple[str, int]]:
        return [(name, slot - self.device_slots) for name in self.lane_blocks]

    # ----- retained entries ------------------------------------------------------------

    def demote_retained(self, tokens, pages, slot, request_class, last_used=None) -> TierOp | None:
        if slot < self.device_slots:
            return None
        return as_op("demote", self.client.demote(content_key(tokens), _page_refs(pages) + self._slot_refs(slot),
                                                  kind="retained", request_class=request_class,
                                                  last_used=time.time() if last_used is None else last_used))

    def restore_retained(self, key, pages, slot, skip=0) -> TierOp | None:
        if slot < self.device_slots:
            return None
        op = as_op("restore", self.client.restore(key, _page_refs(pages) + self._slot_refs(slot), skip))
        op.when_done(lambda o: self._maybe_poison(slot) if o.ok else None)
        return op

    def wait(self, op: TierOp, timeout_s: float) -> TierOp:
        """Poll tierd's replies until ``op`` is done or ``timeout_s`` passed."""
        return self.client.wait(op, timeout_s)

    def locate(self, keys) -> TierOp:
        return as_op("lookup", self.client.lookup(keys))

    def drop_retained(self, key) -> None:
        self.client.drop(key)

    def check_restored(self, pages, num_tokens, slot) -> bool:
        try:
            return finite_pages(self.state, pages, num_tokens) and finite_image(self.state, slot, num_tokens)
        except Exception:  # a check that cannot run refuses the bytes: the request recomputes
            log.exception("checking restored bytes failed; they are not used")
            return False

    def _maybe_poison(self, slot: int) -> None:
        if self.poison_restores > 0:
            self.poison_restores -= 1
            log.warning("FAULT INJECTION: NaN written into the image restored into slot %d", slot)
            poison_image(self.state, slot)

    # ----- live sequences --------------------------------------------------------------

    @staticmethod
    def _live_key(req_id: str, part: str) -> str:
        return content_key(tuple(f"live:{req_id}:{part}".encode()))

    def demote_window(self, req_id, index, pages, request_class) -> TierOp:
        return as_op("demote", self.client.demote(self._live_key(req_id, f"w{index}"), _page_refs(pages),
                                                  kind="live", request_class=request_class, last_used=time.time()))

    def demote_image(self, req_id, lane, request_class) -> TierOp | bool:
        if self.staging_slot is None:
            return False
        self.state.save_image(lane, self.staging_slot)
        if hasattr(self.client, "device_dirty"):
            self.client.device_dirty()  # the staging copy is device work tierd must see finished
        return as_op("demote", self.client.demote(self._live_key(req_id, "image"),
                                                  self._slot_refs(self.staging_slot), kind="live",
                                                  request_class=request_class, last_used=time.time()))

    def restore_window(self, req_id, index, pages) -> TierOp:
        return as_op("restore", self.client.restore(self._live_key(req_id, f"w{index}"), _page_refs(pages)))

    def restore_image(self, req_id) -> TierOp | bool:
        if self.staging_slot is None:
            return False
        op = as_op("restore", self.client.restore(self._live_key(req_id, "image"),
                                                  self._slot_refs(self.staging_slot)))
        op.when_done(lambda o: self._maybe_poison(self.staging_slot) if o.ok else None)
        return op

    def drop_window(self, req_id, index) -> None:
        self.client.drop(self._live_key(req_id, f"w{index}"))

    def drop_image(self, req_id) -> None:
        self.client.drop(self._live_key(req_id, "image"))


def _page_refs(pages) -> list[tuple[str, int]]:
    return [("kv", int(p)) for p in pages]
