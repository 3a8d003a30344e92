"""What exported engine memory looks like to tierd, and how the engine names items in it.

Shared by the exporter (``shared.shm_blocks``), the messages that carry it
(``shared.tier_wire``) and tierd's mapping (``tierd.memory_map``):

- ``BlockDesc``: one exported block seen as runs x items x item_bytes.
- ``UnitLayout``: which blocks make up one demoted entry, in which order.
- a ref ``(block, item)`` names one item; a key is the engine's content hash
  in lowercase hex (it also names a KV-disk file, so nothing else is allowed).

Pure Python; every check raises ValueError or TypeError with the field's name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ignis.shared.wire_fields import check_choice, check_int

BLOCK_KINDS = ("shm", "cuda_ipc")
MAX_BLOCKS = 16
MAX_REFS = 1 << 20

_KEY = re.compile(r"[0-9a-f]{16,128}")
_BLOCK_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
_SHM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_HEX = re.compile(r"(?:[0-9a-f]{2}){1,256}")


def check_key(value: object, name: str = "key") -> str:
    """A content key: 16-128 lowercase hex digits (it also names a KV-disk file)."""
    if type(value) is not str or not _KEY.fullmatch(value):
        raise ValueError(f"{name} must be 16-128 lowercase hex digits, got {value!r}")
    return value


def check_refs(name: str, value: object) -> tuple[tuple[str, int], ...]:
    """``[(block, item), ...]``; JSON lists are accepted and normalized to tuples."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list of [block, item] pairs, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must name at least one item")
    if len(value) > MAX_REFS:
        raise ValueError(f"{name} has {len(value)} refs, at most {MAX_REFS} allowed")
    out = []
    for i, ref in enumerate(value):
        if not isinstance(ref, (list, tuple)) or len(ref) != 2:
            raise ValueError(f"{name}[{i}] must be a [block, item] pair, got {ref!r}")
        block, item = ref
        if type(block) is not str or not _BLOCK_NAME.fullmatch(block):
            raise ValueError(f"{name}[{i}] block must be a block name, got {block!r}")
        out.append((block, check_int(f"{name}[{i}] item", item, 0, 2**31 - 1)))
    return tuple(out)


@dataclass(frozen=True)
class BlockDesc:
    """One exported block of engine memory, seen as ``runs`` x ``items`` x ``item_bytes``.

    Item ``i`` is ``runs`` runs of ``item_bytes`` bytes; run ``r`` of item ``i``
    starts at byte ``r * run_stride_bytes + i * item_bytes`` of the block::

        run 0 | item 0 | item 1 | ... | item N-1 |   <- run_stride_bytes ->
        run 1 | item 0 | item 1 | ... | item N-1 |
        ...

    A KV pool [L, 2, P, 64, H, D] is runs = 2L, items = P, item_bytes =
    64*H*D*dtype, run_stride_bytes = P*item_bytes; a lane block [L, lanes, ...]
    is runs = L, items = lanes. ``handle`` is the POSIX shm name (kind "shm")
    or the CUDA IPC handle as hex (kind "cuda_ipc"). A CUDA block is a whole
    allocation of its own (the handle opens at the block's first byte) on
    CUDA device ``device``; a shm block ignores ``device``.
    """

    name: str
    kind: str
    handle: str
    runs: int
    items: int
    item_bytes: int
    run_stride_bytes: int
    device: int = 0

    def __post_init__(self):
        if type(self.name) is not str or not _BLOCK_NAME.fullmatch(self.name):
            raise ValueError(f"block name must match [a-z][a-z0-9_]{{0,31}}, got {self.name!r}")
        check_choice("block kind", self.kind, BLOCK_KINDS)
        pattern = _SHM_NAME if self.kind == "shm" else _HEX
        if type(self.handle) is not str or not pattern.fullmatch(self.handle):
            what = "a shared-memory name" if self.kind == "shm" else "lowercase hex bytes"
            raise ValueError(f"block {self.name!r}: handle must be {what}, got {self.handle!r}")
        check_int(f"block {self.name!r} runs", self.runs, 1, 1 << 20)
        check_int(f"block {self.name!r} items", self.items, 1, 2**31 - 1)
        check_int(f"block {self.name!r} item_bytes", self.item_bytes, 1, 1 << 40)
        check_int(f"block {self.name!r} run_stride_bytes", self.run_stride_bytes, 0, 1 << 50)
        check_int(f"block {self.name!r} device", self.device, 0, 255)
        if self.run_stride_bytes < self.items * self.item_bytes:
            raise ValueError(f"block {self.name!r}: run_stride_bytes {self.run_stride_bytes} is less than "
                             f"items * item_bytes = {self.items * self.item_bytes} (runs would overlap)")

    @property
    def item_total(self) -> int:
        """Bytes of one item (all its runs)."""
        return self.runs * self.item_bytes

    @property
    def span_bytes(self) -> int:
        """Bytes from the block's start to the end of its last run: the least memory it must have."""
        return (self.runs - 1) * self.run_stride_bytes + self.items * self.item_bytes


@dataclass(frozen=True)
class UnitLayout:
    """Which blocks make up a demoted entry ("state unit").

    An entry's refs are, in this order: any number of items of ``pages``, then
    either one item of each block in ``lane`` (in that order) or one item of
    ``image``, or neither. Its bytes are those items concatenated in ref order.
    """

    pages: str | None = "kv"
    lane: tuple[str, ...] = ("ssm", "conv")
    image: str | None = "host_slots"

    def __post_init__(self):
        lane = tuple(self.lane) if isinstance(self.lane, (list, tuple)) else self.lane
        if type(lane) is not tuple or len(lane) > MAX_BLOCKS:
            raise TypeError(f"unit lane must be a list of at most {MAX_BLOCKS} block names")
        object.__setattr__(self, "lane", lane)
        named = [n for n in (self.pages, *lane, self.image) if n is not None]
        for n in named:
            if type(n) is not str or not _BLOCK_NAME.fullmatch(n):
                raise ValueError(f"unit layout names a bad block name {n!r}")
        if not named:
            raise ValueError("unit layout names no block")
        if len(set(named)) != len(named):
            raise ValueError(f"unit layout uses a block twice: {named}")
