"""Live-sequence eviction: a lower-ranked running sequence moves down a tier, window by window.

Pure Python; the bytes move through the ``TierPort`` given at construction
(tierd's, or a fake in tests). Live eviction is on only with a staging slot,
which the engine reserves only when its port reaches a tierd. When a
higher-ranked request cannot fit (no lane, or no pages once retained entries
are gone), the lowest-ranked decoding sequence below it is marked EVICTING.
It stops decoding, and each round, between forwards, ``window`` of its pages
move down (``demote_window``) while the other lanes keep generating. After
the last window its state image (recurrent + conv state and window extras,
staged through the one reserved host slot) follows (``demote_image``); then
it gives up its lane and pages and waits at the front of its class's queue.
Its sampler (RNG, penalty counts) stays with the runner, keyed by request id.

Resume: at admission the windows come back, in order, into fresh pages of a
new table and the image into the staging slot (``restore``), the lane loads
it, and the sequence decodes on from where it stopped: bit-exact, since no
token is recomputed. If a demote is refused (every tier full of live work)
the eviction is abandoned and the sequence decodes on; if a restore misses,
the sequence recomputes its tokens instead, as it does when the restored
bytes are not finite (``TierPort.check_restored``). Either way, once a sequence is
resumed, abandoned or ended, every copy it had below is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ignis.engine.tier_port import TierPort


@dataclass
class Evicted:
    """Where an evicted sequence's state went: ``windows`` page chunks and one image."""

    computed: int  # tokens whose KV and state were saved
    windows: list[list[int]] = field(default_factory=list)  # page ids at eviction, per window
    image: bool = False
    next_page: int = 0  # pages demoted so far

    @property
    def num_pages(self) -> int:
        return sum(len(w) for w in self.windows)


class Evictor:
    """``staging_slot``: the host slot images of evicted sequences pass through (None: live eviction off)."""

    def __init__(self, tiers: TierPort, window_pages: int, staging_slot: int | None):
        if window_pages < 1:
            raise ValueError(f"--evict-window-pages must be >= 1, got {window_pages}")
        self.tiers = tiers
        self.window = window_pages
        self.staging_slot = staging_slot
        self.evicting: dict[str, Evicted] = {}
        self.evictions = 0
        self.resumes = 0
        self.abandoned = 0
        self.restore_rejections = 0
        self._abandoned_seen = 0

    @property
    def enabled(self) -> bool:
        return self.staging_slot is not None

    def start(self, req) -> None:
        self.evicting[req.req_id] = Evicted(computed=req.num_computed_tokens)

    def step(self, req) -> str:
        """One window for ``req``: "more" (windows left), "done" (all saved) or "failed"."""
        rec = self.evicting[req.req_id]
        pages = list(req.page_table.pages)
        if rec.next_page < len(pages):
            chunk = pages[rec.next_page:rec.next_page + self.window]
            if not self.tiers.demote_window(req.req_id, len(rec.windows), chunk, req.request_class):
                return "failed"
            rec.windows.append(chunk)
            rec.next_page += len(chunk)
            if rec.next_page < len(pages):
                return "more"
        if not self.tiers.demote_image(req.req_id, req.lane, req.request_class):
            return "failed"
        rec.image = True
        rec.computed = req.num_computed_tokens  # the round that was in flight at the start has been applied
        self.evictions += 1
        return "done"

    def failed_lately(self) -> bool:
        """An eviction was abandoned (a tier refused) since the last call: do not count on the next one."""
        failed, self._abandoned_seen = self.abandoned != self._abandoned_seen, self.abandoned
        return failed

    def abandon(self, req) -> None:
        rec = self.evicting.pop(req.req_id, None)
        if rec is not None:
            self.drop(req.req_id, rec)
            self.abandoned += 1

    def restore(self, req, record: Evicted) -> bool:
        """Bring an evicted sequence back into its new page table; drops the lower copies either way."""
        pages = list(req.page_table.pages[:record.num_pages])
        ok = len(pages) == record.num_pages and self._restore(req.req_id, record, pages)
        if ok and not self.tiers.check_restored(pages, record.computed, self.staging_slot):
            ok = False  # non-finite bytes: never used, the sequence recomputes
            self.restore_rejections += 1
        self.drop(req.req_id, record)
        if ok:
            self.resumes += 1
        return ok

    def _restore(self, req_id: str, record: Evicted, pages: list[int]) -> bool:
        """Each window into its share of ``pages`` (in order), then the image; stops at the first miss."""
        at = 0
        for i, window in enumerate(record.windows):
            if not self.tiers.restore_window(req_id, i, pages[at:at + len(window)]):
                return False
            at += len(window)
        return self.tiers.restore_image(req_id)

    def drop(self, req_id: str, record: Evicted) -> None:
        """Every copy ``record`` has below: its windows, and its image once it was saved."""
        for i in range(len(record.windows)):
            self.tiers.drop_window(req_id, i)
        if record.image:
            self.tiers.drop_image(req_id)

    def forget(self, req_id: str) -> None:
        """A request that ended while evicting or evicted: its lower copies go."""
        rec = self.evicting.pop(req_id, None)
        if rec is not None:
            self.drop(req_id, rec)
