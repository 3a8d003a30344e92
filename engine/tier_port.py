"""``TierPort``: what the retained store and the live evictor ask of the tiers below the device.

Pure Python, no torch, and no engine types: the port speaks tierd's terms
(keys, page ids, slot ids, request ids), so the store and the evictor import
it and it imports neither. The engine builds one port at load and hands it to
the scheduler, which gives it to the store and the evictor; when no tierd is
configured, or the engine's memory cannot be shared with it, that port is a
``NullTierPort``.

Invariants every port keeps:

- A copy is two-phase: the call posts it and returns a handle
  (``engine.tier_ops.TierOp``), or a plain value when the port answers at
  once (``as_op`` turns either into a handle). ``poll``, once per round at the
  start of ``Scheduler.schedule``, completes handles whose replies arrived; it
  never blocks unless asked to wait (an idle round). Until a handle is done
  (a demote) or its memory is free (a restore), the caller keeps the pages and
  slot it named out of every other use: the engine reuses no page or slot a
  copy still reads or writes.
- A refused demote or a missed restore is a cache miss, never an error: the
  caller carries on without the lower tiers (the destination is then unused).
- Restored bytes are used only after ``check_restored`` accepts them; a
  rejected retained entry is dropped below (``drop_retained``) and treated as
  a miss, a rejected live sequence recomputes.
- ``session`` changes on every accepted hello; tierd holds nothing of the
  engine's from before the latest one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class TierPort(Protocol):
    @property
    def session(self) -> int:
        """Accepted hellos so far (0 before the first)."""

    @property
    def live_on_disk(self) -> bool:
        """KV-disk is on below: no evicted live sequence is discarded there, so when every tier refuses
        one, a request ranked above it waits rather than push it out."""

    def poll(self, wait_s: float = 0.0) -> int:
        """Complete the handles whose replies arrived (waiting up to ``wait_s`` for one while any is in
        flight); how many replies were taken."""

    def renew(self) -> bool:
        """Start a new session with nothing in flight: the lower tiers drop every entry they held for us
        (``session`` moves on). False when they could not be told (unreachable: their next session,
        whenever it starts, begins empty all the same)."""

    # ----- retained entries (the store) ------------------------------------------

    def demote_retained(self, tokens: tuple[int, ...], pages: Sequence[int], slot: int,
                        request_class: str, last_used: float | None = None) -> str | None:
        """Copy the retained entry over ``tokens`` (its pages in order, the image in ``slot``) down,
        under ``content_key(tokens)`` (``engine.reuse.lower_index``), the key the store's records and
        ``restore_retained`` use; the tier it landed in ("ram" / "disk"), or None when it did not move.
        ``last_used``: when the entry was last used (unix s; None: now), where tierd's TTL counts from."""

    def restore_retained(self, key: str, pages: Sequence[int], slot: int, skip: int = 0) -> str | None:
        """Copy the entry under ``key`` into ``pages`` and ``slot``, but for its first ``skip`` pages
        (shared from a device entry instead: ``pages`` are those after them); the tier it was read
        from, or None."""

    def locate(self, keys: list[str]):
        """Where each key is now: a handle (or plain value) of a dict "ram" / "disk" / None (gone) per key;
        a failed handle (or None) when tierd cannot answer."""

    def drop_retained(self, key: str) -> None:
        """Forget the retained entry under ``key`` below (its restored copy was rejected)."""

    def check_restored(self, pages: Sequence[int], num_tokens: int, slot: int) -> bool:
        """The restore just made holds usable bytes: rows ``0 .. num_tokens-1`` of ``pages`` (in order)
        and the image in ``slot`` are finite (``engine.tiers.restore_check``)."""

    # ----- live sequences (the evictor) ---------------------------------------------

    def demote_window(self, req_id: str, index: int, pages: Sequence[int], request_class: str) -> bool:
        """Copy window ``index`` of a live sequence (these pages, in order) down."""

    def demote_image(self, req_id: str, lane: int, request_class: str) -> bool:
        """Stage the state image of ``lane`` in the staging slot and copy it down."""

    def restore_window(self, req_id: str, index: int, pages: Sequence[int]) -> bool:
        """Copy window ``index`` back into ``pages`` (as many as it had, in order)."""

    def restore_image(self, req_id: str) -> bool:
        """Copy the state image back into the staging slot."""

    def drop_window(self, req_id: str, index: int) -> None:
        """Forget window ``index`` below."""

    def drop_image(self, req_id: str) -> None:
        """Forget the state image below."""


class NullTierPort:
    """No tier below the device: nothing moves down, nothing is found there."""

    session = 0
    in_flight = 0
    live_on_disk = False

    def poll(self, wait_s: float = 0.0) -> int:
        return 0

    def renew(self) -> bool:
        return True

    def demote_retained(self, tokens, pages, slot, request_class, last_used=None) -> None:
        return None

    def restore_retained(self, key, pages, slot, skip=0) -> None:
        return None

    def locate(self, keys) -> None:
        return None

    def drop_retained(self, key) -> None:
        return None

    def check_restored(self, pages, num_tokens, slot) -> bool:
        return True

    def demote_window(self, req_id, index, pages, request_class) -> bool:
        return False

    def demote_image(self, req_id, lane, request_class) -> bool:
        return False

    def restore_window(self, req_id, index, pages) -> bool:
        return False

    def restore_image(self, req_id) -> bool:
        return False

    def drop_window(self, req_id, index) -> None:
        return None

    def drop_image(self, req_id) -> None:
        return None


NO_TIERS = NullTierPort()
"""The port of an engine without lower tiers (stateless: one serves every store and evictor)."""
