"""Why a request reused less than it shares with an earlier prompt.

At admission a request knows (from ``engine.reuse.learned_points``) how many
whole pages it shares with the most similar earlier prompt and where that
prompt's request planned its captures. When it resumes at least a page short
of the shared prefix, the reason is one of:

    unseen     nothing was reused and no earlier prompt shares a page
    no_mark    the earlier request planned no capture point inside the shared prefix
    slot_busy  it planned one, but the capture was skipped (no free slot or page)
    evicted    the capture was made, then released for room (or by a restart or unload)
    tier_failed  the capture went to KV-RAM or KV-disk and its restore failed there (tierd refused
               it, timed out, or its file was bad or gone): the request computed instead
    budget     the capture was made, then dropped by its conversation's two-checkpoint budget
    no_room    the capture sits in KV-RAM or KV-disk, but the device had no free pages (or host
               slot) to restore it into, and none were on their way: the request computed it
    aborted    the earlier request ended (aborted, or an error) before it reached the capture
    not_ready  the capture was planned but not taken yet (the earlier request is still
               prefilling towards it)
    below_floor  the capture sits in KV-RAM or KV-disk, but what it adds over the device's match is
               less than that tier's restore floor: computing it was judged cheaper than the copy

``Fates`` remembers, by content, what happened to recent captures that are
gone or never were. Pure Python, no torch.
"""

from __future__ import annotations

from collections import OrderedDict

from ignis.engine.reuse.lower_index import content_key

REASONS = ("unseen", "no_mark", "slot_busy", "evicted", "tier_failed", "budget", "no_room", "aborted",
           "not_ready", "below_floor")


class Fates:
    """Bounded map: content key of a capture's tokens -> "slot_busy" | "evicted" | "tier_failed" | "budget"
    | "no_room" | "aborted" | "below_floor" (newest kept)."""

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._fates: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._fates)

    def note(self, tokens: tuple[int, ...], fate: str) -> None:
        if fate not in REASONS:
            raise ValueError(f"fate must be one of {REASONS}, got {fate!r}")
        key = content_key(tokens)
        self._fates.pop(key, None)
        self._fates[key] = fate
        while len(self._fates) > self.limit:
            self._fates.popitem(last=False)

    def of(self, tokens: tuple[int, ...]) -> str | None:
        return self._fates.get(content_key(tokens))


def shortfall_reason(tokens: tuple[int, ...], matched: int, shared: int, earlier_cuts: tuple[int, ...],
                     fates: Fates, page_tokens: int, own_cuts: tuple[int, ...] = ()) -> str:
    """The reason a prompt ``tokens`` resumed at ``matched`` while sharing ``shared`` (see above),
    or "none" when it fell short by less than a page. ``own_cuts``: where this prompt plans its own
    captures; a capture an earlier identical prefix made there has a fate too (a turn sent again after
    its conversation went on, whose checkpoint the two-checkpoint budget dropped), though the newest
    prompt sharing those pages (``earlier_cuts``) planned none there."""
    if matched == 0 and shared == 0:
        return "unseen"
    if shared - matched < page_tokens:
        return "none"
    # A conversation's checkpoint sits at its generation opener, inside the page ``shared`` rounds down
    # to: past ``shared``, but shared when the capture's own tokens begin this prompt, which its fate's
    # content key says.
    near = min(shared + page_tokens, len(tokens) + 1)
    fate = _deepest_fate(tokens, {c for c in (*earlier_cuts, *own_cuts) if shared < c < near}, fates)
    if fate is not None:
        return fate
    inside = [c for c in earlier_cuts if matched < c <= shared]
    if inside:
        return fates.of(tuple(tokens[:max(inside)])) or "not_ready"
    return _deepest_fate(tokens, {c for c in own_cuts if matched < c <= shared}, fates) or "no_mark"


def _deepest_fate(tokens: tuple[int, ...], cuts: set[int], fates: Fates) -> str | None:
    """The fate of the capture at the deepest of ``cuts`` that has one (None: none has)."""
    for c in sorted(cuts, reverse=True):
        fate = fates.of(tuple(tokens[:c]))
        if fate is not None:
            return fate
    return None
