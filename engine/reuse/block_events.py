"""KV block events of retained entries: which full pages each tier holds, told as vLLM's block events.

Pure Python. A cache-aware router (llm-d's inference scheduler, NVIDIA
Dynamo's KV router) keeps an index of which blocks each engine holds, fed by
``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` events. Here a block
is one full page of a retained entry, named by its content hash (the chain
hash ``h_k`` of ``engine.reuse.hashing``, the one the retained index files
entries under), cut to its first 8 bytes read big-endian with the top bit
cleared: a non-negative integer below 2**63, which decoders that take block
hashes as signed (Dynamo) or unsigned (llm-d) 64-bit integers both accept.
The partial last page of an entry is never a block. A block's ``token_ids``
are its key tokens (an image's run as its key ids) with a salted prompt's
salted ids given back as the tokens they stand for, as vLLM gives a salted
block's tokens beside its salted hash (``engine.reuse.salt_keys``).

Several entries share their leading pages (a conversation's checkpoints, a
retained prefix under its checkpoints), so the ledger counts holders per
block and medium: a block is *stored* when its first holder in a medium
arrives and *removed* when its last one goes. Every holder of ``h_k`` holds
``h_1 .. h_{k-1}`` too, so the blocks an entry adds (or drops) are always
the tail of its chain: one ``BlockStored`` whose parent is the block before
that tail, one ``BlockRemoved``.

Media (vLLM's ``medium`` field): "GPU" the device pool, "CPU" tierd's KV-RAM,
"DISK" tierd's KV-disk. A move down a tier is a store in the lower medium
and, once the device lets the entry go, a removal from "GPU"; a spill from
KV-RAM to KV-disk is a removal from "CPU" and a store in "DISK".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ignis.engine.reuse.hashing import page_chain
from ignis.engine.reuse.salt_keys import raw_token

MEDIA = ("GPU", "CPU", "DISK")
TIER_MEDIUM = {"device": "GPU", "ram": "CPU", "disk": "DISK"}
"""The medium of a tier, by the names the store and tierd use."""


BLOCK_ID_MASK = (1 << 63) - 1


def block_id(digest: bytes) -> int:
    """A page's chain hash as the block hash routers see: its first 8 bytes, big-endian, top bit cleared."""
    return int.from_bytes(digest[:8], "big") & BLOCK_ID_MASK


@dataclass(frozen=True)
class BlockStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str
    lora_id: int | None = None


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]
    medium: str


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


BlockEvent = BlockStored | BlockRemoved | AllBlocksCleared


class BlockLedger:
    """Counts the holders of every block per medium and emits the events that change what a medium holds."""

    def __init__(self, page_tokens: int, emit: Callable[[BlockEvent], None]):
        if page_tokens < 1:
            raise ValueError(f"page_tokens must be >= 1, got {page_tokens}")
        self.page_tokens = page_tokens
        self._emit = emit
        self._holders: dict[str, dict[bytes, int]] = {m: {} for m in MEDIA}

    def blocks(self, medium: str) -> int:
        """Blocks ``medium`` holds now."""
        return len(self._holders[medium])

    def held(self, tokens: Sequence[int], medium: str) -> None:
        """One more holder of the full pages of ``tokens`` in ``medium``."""
        chain = page_chain(tokens, self.page_tokens)  # [h_0 (seed), h_1, ..., h_K]
        counts = self._holders[medium]
        first_new = None
        for k in range(1, len(chain)):
            before = counts.get(chain[k], 0)
            counts[chain[k]] = before + 1
            if before == 0 and first_new is None:
                first_new = k
        if first_new is None:
            return
        pt = self.page_tokens
        self._emit(BlockStored(
            tuple(block_id(h) for h in chain[first_new:]),
            block_id(chain[first_new - 1]) if first_new > 1 else None,
            tuple(raw_token(t) for t in tokens[(first_new - 1) * pt:(len(chain) - 1) * pt]), pt, medium))

    def dropped(self, tokens: Sequence[int], medium: str) -> None:
        """One holder fewer; blocks left with none are removed. Blocks the ledger does not hold (after a
        ``cleared``) are skipped."""
        chain = page_chain(tokens, self.page_tokens)
        counts = self._holders[medium]
        gone = []
        for h in chain[1:]:
            left = counts.get(h)
            if left is None:
                continue
            if left <= 1:
                del counts[h]
                gone.append(block_id(h))
            else:
                counts[h] = left - 1
        if gone:
            self._emit(BlockRemoved(tuple(gone), medium))

    def moved(self, tokens: Sequence[int], src: str, dst: str) -> None:
        """An entry went from medium ``src`` to ``dst`` (same medium: nothing)."""
        if src != dst:
            self.held(tokens, dst)
            self.dropped(tokens, src)

    def cleared(self) -> None:
        """Nothing is held anywhere any more (the model was unloaded or switched)."""
        for counts in self._holders.values():
            counts.clear()
        self._emit(AllBlocksCleared())


class NoBlockEvents:
    """The ledger when KV events are off: every call does nothing (and hashes nothing)."""

    def blocks(self, medium: str) -> int:
        return 0

    def held(self, tokens, medium) -> None:
        pass

    def dropped(self, tokens, medium) -> None:
        pass

    def moved(self, tokens, src, dst) -> None:
        pass

    def cleared(self) -> None:
        pass


NO_BLOCK_EVENTS = NoBlockEvents()
