"""Restored bytes are checked before use: KV rows and state images must be finite.

A restore from tierd (KV-RAM or KV-disk) lands in engine memory that the next
round reads; a corrupt copy (a bad disk, a bad RAM arena, a bug below) would
otherwise poison every token after it. Only what the restore wrote is read,
so the cost is proportional to the restored bytes::

    pages  [L_full, 2, num_pages, 64, ...]   rows 0 .. num_tokens-1 of the restored pages,
                                             in order (the last page may be partial: its
                                             unwritten tail is never looked at)
    image  slot_ssm / slot_conv / slot_window, item ``slot`` of its block (the window's
           rows the image's tokens wrote: all W once it holds W tokens or more)

Compressed (hq-e8-2b) pages are int16 codes: always "finite"; their exact
window travels in the image and is checked there.

``FAULT_NAN_RESTORE_ENV`` (tests only) writes NaN into the image of the next N
restores, so the check and the recompute behind it can be exercised end to end.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ignis.engine.models.config import PAGE_TOKENS
from ignis.shared.fault_env import env_count

FAULT_NAN_RESTORE_ENV = "IGNIS_ENGINE_FAULT_NAN_RESTORES"


def fault_nan_restores() -> int:
    """How many restores the test hook poisons (0: off)."""
    return env_count(FAULT_NAN_RESTORE_ENV)


def _image_parts(state, slot: int, num_tokens: int | None = None) -> list[torch.Tensor]:
    """Views of the state image in ``slot`` (ssm, conv and, for hq-e8-2b, the window). With ``num_tokens``
    (the tokens the image holds), only the window rows written: a ring of W rows where position p sits at
    row p % W, so rows ``0 .. min(num_tokens, W) - 1``."""
    block, i = state._slot(slot)
    parts = [blocks[block][:, i] for blocks in (state.slot_ssm, state.slot_conv) if blocks]
    if state.slot_window:
        window = state.slot_window[block][:, i]  # [L_full, 2, W, Hkv, D]
        parts.append(window if num_tokens is None else window[:, :, :max(0, num_tokens)])
    return parts


CHECK_PAGES = 16
"""Pages gathered at a time for the check: its temporary is this many pages of every attention layer
(96 MiB on the 27B in bf16), whatever the restored length (a whole 262K-token context at once would
take 24 GiB the device does not have, and the restore would be refused)."""


def finite_pages(state, pages: Sequence[int], num_tokens: int) -> bool:
    """Rows ``0 .. num_tokens-1`` of ``pages`` (in order) hold no NaN or inf. One host sync."""
    pool = state.pages
    if not pool.is_floating_point() or num_tokens <= 0:
        return True
    full, rest = divmod(num_tokens, PAGE_TOKENS)
    ids = [int(p) for p in pages]
    index = torch.tensor(ids[:full], device=pool.device)
    ok = torch.ones((), dtype=torch.bool, device=pool.device)
    for start in range(0, full, CHECK_PAGES):
        ok &= torch.isfinite(pool.index_select(2, index[start:start + CHECK_PAGES])).all()
    if rest:
        ok &= torch.isfinite(pool[:, :, ids[full], :rest]).all()
    return bool(ok)


def finite_image(state, slot: int, num_tokens: int | None = None) -> bool:
    """The state image in ``slot`` holds no NaN or inf (with ``num_tokens``, the tokens it holds: only the
    exact-window rows they wrote are read; a short sequence's other rows hold whatever the lane held)."""
    return all(bool(torch.isfinite(part).all()) for part in _image_parts(state, slot, num_tokens))


def poison_image(state, slot: int) -> None:
    """The fault hook: one NaN in the recurrent state of ``slot``'s image."""
    part = _image_parts(state, slot)[0]
    part[(0,) * part.dim()] = float("nan")
