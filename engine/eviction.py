"""Live-sequence eviction: a lower-ranked running sequence moves down a tier, window by window.

Pure Python; the bytes move through the ``TierPort`` given at construction
(tierd's, or a fake in tests). Live eviction is on only with a staging slot,
which the engine reserves only when its port reaches a tierd. When a
higher-ranked request cannot fit (no lane, or no pages once retained entries
are gone), the lowest-ranked decoding sequence below it is marked EVICTING.
It stops decoding, and between forwards ``window`` of its pages at a time
move down (``demote_window``: posted, one copy in flight per sequence, the
next posted in the round the last one landed) while the other lanes keep
generating; a window's pages are held (``PageHold``) until its copy is
done, whatever happens to the request meanwhile. After the last window its
state image (recurrent + conv state and window extras, staged through the
one reserved host slot) follows (``demote_image``); then it gives up its
lane and pages and waits at the front of its class's queue. Its sampler
(RNG, penalty counts) stays with the runner, keyed by request id.

Resume (``prepare``, then ``take``): at the head of its queue the sequence
reserves every page its table will need and the staging slot, and posts the
restores of all its windows (in order, into the first pages) and its image;
it waits there until they have landed and passed the finite check, then
takes a lane, its new table adopts the reserved pages, the lane loads the
image, and it decodes on from where it stopped: bit-exact, since no token
is recomputed. The staging slot has one user at a time. If a demote is refused (every tier full of live work)
the eviction is abandoned and the sequence decodes on; if a restore misses,
the sequence recomputes its tokens instead, as it does when the restored
bytes are not finite (``TierPort.check_restored``). Either way, once a sequence is
resumed, abandoned or ended, every copy it had below is dropped. After an
abandoned eviction no other starts for a waiting request for a while
(``may_start``: 50 ms, doubling with each abandon in a row up to 2 s, cleared
by an eviction that lands), so a full tier is not asked again every round
(a decode short of a page preempts by recompute after a refusal instead).

A resume can be withdrawn (``withdraw``): its reserved pages and the staging
slot go back once its restores no longer touch them, its copies below stay,
and it prepares again the next time it leads its queue. Admission withdraws
it for another head short of pages (the reservation is the room that head
needs); an eviction whose image waits for the staging slot withdraws the
resume holding it (the slot has one user, and that resume may wait for a
lane the evicting sequence holds).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ignis.engine.sequence_pages import SequencePages
from ignis.engine.tier_ops import PageHold, TierOp, as_op
from ignis.engine.tier_port import TierPort


RETRY_AFTER_S = (0.05, 2.0)
"""After an abandoned eviction: the first wait before another starts, and the most it doubles to."""


@dataclass
class Evicted:
    """Where an evicted sequence's state went: ``windows`` page chunks and one image."""

    computed: int  # tokens whose KV and state were saved
    windows: list[list[int]] = field(default_factory=list)  # page ids at eviction, per window
    image: bool = False
    next_page: int = 0  # pages demoted so far
    lost: bool = False  # the copies did not come back: the sequence recomputes
    op: TierOp | None = field(default=None, repr=False)  # the demote in flight (one at a time)
    part: list[int] | None = field(default=None, repr=False)  # its window (None: the image)

    @property
    def num_pages(self) -> int:
        return sum(len(w) for w in self.windows)


@dataclass
class Resume:
    """An evicted sequence's copies coming back: into ``owner``'s pages (no page table's) and the staging slot."""

    owner: SequencePages
    ops: list[TierOp]
    rejected: bool = False

    @property
    def pending(self) -> bool:
        return any(op.pending for op in self.ops)

    @property
    def ok(self) -> bool:
        return all(op.ok for op in self.ops)


class Evictor:
    """``staging_slot``: the host slot images of evicted sequences pass through (None: live eviction off).

    The staging slot has one user at a time (``staging_user``): an image on its
    way down, or one on its way back until the round that loads it into a lane."""

    def __init__(self, tiers: TierPort, window_pages: int, staging_slot: int | None,
                 clock: Callable[[], float] = time.monotonic):
        if window_pages < 1:
            raise ValueError(f"--evict-window-pages must be >= 1, got {window_pages}")
        self.tiers = tiers
        self.window = window_pages
        self.staging_slot = staging_slot
        self.evicting: dict[str, Evicted] = {}
        self.resuming: dict[str, Resume] = {}
        self.staging_user: str | None = None
        self._staging_loaded = False  # the staged image was handed to a lane: free at the next round
        self._holds: list[PageHold] = []  # windows whose demote is in flight
        self._ending: list[Resume] = []  # resumes ended or withdrawn whose restores still write their room
        self.evictions = 0
        self.resumes = 0
        self.abandoned = 0
        self.withdrawn = 0
        self.restore_rejections = 0
        self._abandoned_seen = 0
        self.clock = clock
        self._retry_wait = 0.0  # after the last abandon in a row (0: none)
        self._retry_at = 0.0

    @property
    def enabled(self) -> bool:
        return self.staging_slot is not None

    def may_start(self) -> bool:
        """Whether a new eviction may start: on, and not backing off after an abandoned one."""
        return self.enabled and (self._retry_wait == 0.0 or self.clock() >= self._retry_at)

    @property
    def copies_in_flight(self) -> int:
        return (sum(1 for r in self.evicting.values() if r.op is not None and r.op.pending)
                + sum(1 for r in self.resuming.values() if r.pending) + len(self._holds) + len(self._ending))

    @property
    def pages_coming(self) -> int:
        """Pages that go back to the free list once copies still in flight are done with them, without anyone
        giving any up: evicted windows whose demote is in flight, and the room of resumes that ended or were
        withdrawn while their restores write it (not one whose restore timed out: tierd may never answer)."""
        return (sum(hold.sole() for hold in self._holds)
                + sum(r.owner.sole() for r in self._ending if r.pending))

    def round_start(self) -> None:
        """A new round: an image a lane loaded last round has left the staging slot."""
        if self._staging_loaded:
            self._staging_loaded = False
            self.staging_user = None

    def start(self, req) -> None:
        self.evicting[req.req_id] = Evicted(computed=req.num_computed_tokens)

    # ----- down ----------------------------------------------------------------------

    def step(self, req) -> str:
        """Move ``req`` on by at most one posted copy: "more" (copies left or in flight), "done" (all
        below) or "failed" (a tier refused or tierd did not answer)."""
        rec = self.evicting[req.req_id]
        pages = list(req.page_table.pages)
        posted = False
        while True:
            if rec.op is not None:
                if rec.op.pending:
                    return "more"
                if not self._landed(rec):
                    return "failed"
                if rec.image:
                    rec.computed = req.num_computed_tokens  # the round in flight at the start has been applied
                    self.evictions += 1
                    self._retry_wait = 0.0
                    return "done"
            if posted and rec.next_page < len(pages):
                return "more"  # one window a round
            if rec.next_page < len(pages):
                rec.part = pages[rec.next_page:rec.next_page + self.window]
                rec.op = self._post_window(req, len(rec.windows), rec.part)
            else:
                if self.staging_user in self.resuming:
                    self.withdraw(self.staging_user)  # its resume may wait for the lane this sequence frees
                if self.staging_user not in (None, req.req_id):
                    return "more"  # another image is in the staging slot (or a withdrawn restore's, till it lands)
                self.staging_user = req.req_id
                rec.part = None
                rec.op = as_op("demote", self.tiers.demote_image(req.req_id, req.lane, req.request_class))
                rec.op.when_free(lambda _op, rid=req.req_id: self._unstage(rid))
            posted = True

    def _post_window(self, req, index: int, chunk: list[int]) -> TierOp:
        op = as_op("demote", self.tiers.demote_window(req.req_id, index, chunk, req.request_class))
        if op.pending:  # the pages stay out of the pool until the copy is done, whatever the request does
            hold = PageHold(req.page_table.pool, chunk, f"evicting-{req.req_id}-{index}")
            self._holds.append(hold)

            def free(_op):
                self._holds.remove(hold)
                hold.release()

            op.when_free(free)
        return op

    def _landed(self, rec: Evicted) -> bool:
        op, rec.op = rec.op, None
        if not op.ok:
            return False
        if rec.part is None:
            rec.image = True
        else:
            rec.windows.append(rec.part)
            rec.next_page += len(rec.part)
        return True

    def _unstage(self, req_id: str) -> None:
        if self.staging_user == req_id and req_id not in self.resuming:
            self.staging_user = None

    def failed_lately(self) -> bool:
        """An eviction was abandoned (a tier refused) since the last call: do not count on the next one."""
        failed, self._abandoned_seen = self.abandoned != self._abandoned_seen, self.abandoned
        return failed

    def abandon(self, req) -> None:
        rec = self.evicting.pop(req.req_id, None)
        if rec is not None:
            self.drop(req.req_id, rec)
            self.abandoned += 1
            first, most = RETRY_AFTER_S
            self._retry_wait = min(most, self._retry_wait * 2 or first)
            self._retry_at = self.clock() + self._retry_wait

    # ----- back up ---------------------------------------------------------------------

    def prepare(self, req, record: Evicted, pool) -> str:
        """Bring ``req``'s copies back into reserved pages and the staging slot: "wait" (posted, or no
        room / staging slot yet), "ready" (landed and finite: ``take`` them) or "failed" (recompute).
        The lower copies are dropped once it is ready or failed."""
        resume = self.resuming.get(req.req_id)
        if resume is None:
            capacity = max(record.num_pages * pool.page_tokens, req.num_tokens + 1)
            if self.staging_user is not None or pool.pages_for(capacity) > pool.num_free:
                return "wait"
            owner = SequencePages(pool, f"resuming-{req.req_id}")
            owner.ensure_capacity(capacity)  # every page its table needs: once landed, only a lane is wanted
            self.staging_user = req.req_id
            resume = Resume(owner, self._post_restores(req.req_id, record, list(owner.pages)))
            self.resuming[req.req_id] = resume
        if resume.pending:
            return "wait"
        if resume.ok and not resume.rejected and not self.tiers.check_restored(resume.owner.pages, record.computed,
                                                                             self.staging_slot):
            resume.rejected = True  # non-finite bytes: never used, the sequence recomputes
            self.restore_rejections += 1
        if resume.ok and not resume.rejected:
            return "ready"
        self._end_resume(req.req_id, record)
        return "failed"

    def _post_restores(self, req_id: str, record: Evicted, pages: list[int]) -> list[TierOp]:
        """Each window into its share of ``pages`` (in order), then the image; all posted together."""
        ops, at = [], 0
        for i, window in enumerate(record.windows):
            ops.append(as_op("restore", self.tiers.restore_window(req_id, i, pages[at:at + len(window)])))
            at += len(window)
        ops.append(as_op("restore", self.tiers.restore_image(req_id)))
        return ops

    def take(self, req, record: Evicted) -> SequencePages:
        """The landed copies of a "ready" resume: the table holding them and the room to decode on (the
        caller's table adopts it); the staged image is loaded by the round that starts the lane."""
        resume = self.resuming.pop(req.req_id)
        self.drop(req.req_id, record)
        self.resumes += 1
        self._staging_loaded = True
        return resume.owner

    def withdraw(self, req_id: str) -> None:
        """``req_id``'s resume gives its reserved pages and the staging slot back (once its restores are done
        with them); its copies below stay, and it prepares again later."""
        if req_id in self.resuming:
            self.withdrawn += 1
            self._end_resume(req_id, None)

    def _end_resume(self, req_id: str, record: Evicted | None) -> None:
        """The resume of ``req_id`` ends: its reservation goes back once tierd is done with it; its copies
        below are dropped unless ``record`` is None (withdrawn: they are read again later)."""
        resume = self.resuming.pop(req_id, None)
        if record is not None:
            self.drop(req_id, record)
        if resume is None:
            return
        left = [op for op in resume.ops if not op.memory_free]
        self._ending.append(resume)

        def free(_op=None):
            if all(op.memory_free for op in resume.ops) and resume in self._ending:
                self._ending.remove(resume)
                resume.owner.release()
                if self.staging_user == req_id:
                    self.staging_user = None

        for op in left:
            op.when_free(free)
        if not left:
            free()

    # ----- copies below ------------------------------------------------------------------

    def drop(self, req_id: str, record: Evicted) -> None:
        """Every copy ``record`` has below: its windows, and its image once it was saved (a demote still
        in flight is dropped once it lands; one that landed in this round's poll, not yet counted, now)."""
        for i in range(len(record.windows)):
            self.tiers.drop_window(req_id, i)
        if record.image:
            self.tiers.drop_image(req_id)
        op = record.op
        if op is not None:
            index, part = len(record.windows), record.part
            op.when_done(lambda o: (self.tiers.drop_image(req_id) if part is None
                                    else self.tiers.drop_window(req_id, index)) if o.ok else None)

    def forget(self, req_id: str, record: Evicted | None = None) -> None:
        """A request that ended while evicting or evicted: its lower copies go (and any resume of them)."""
        rec = self.evicting.pop(req_id, None)
        if rec is not None:
            self.drop(req_id, rec)
        if req_id in self.resuming:
            self._end_resume(req_id, record or Evicted(0))
        elif record is not None:
            self.drop(req_id, record)
