"""The vocabulary-wide steps of sampling one row, done in place in a workspace reused across rows and rounds.

Temperature, top-k, min-p and top-p set disallowed tokens of a working row to
-inf; ``draw`` takes one fp64 inverse-cdf draw from what is left. Every step
writes into :class:`SamplerWorkspace` buffers of the vocabulary's width, so
sampling a row at a 248K-token vocabulary allocates nothing of that width.
Each step gives the same bits as its plain form in
``tests/engine/sampling_reference.py`` (a fresh tensor per step, the whole row
sorted for top-p), which the tests hold it to.
"""

from __future__ import annotations

from typing import Optional

import torch

from ignis.shared.sampling import SamplingParams


class SamplerWorkspace:
    """Scratch of one vocabulary width that every row of every round reuses.

    A row is sampled in these buffers and nowhere else: no vocab-sized tensor
    is allocated per row or per round (small tensors of candidate ids and
    values aside), and the caller's logits are never written.
    """

    def __init__(self, vocab: int):
        self.vocab = vocab
        self.row = torch.empty(vocab)  # the working logits of the row being sampled
        self.probs = torch.empty(vocab)  # fp32 softmax (min-p), then the sorted softmax (top-p)
        self.sorted = torch.empty(vocab)  # top-p: the row sorted descending
        self.cum = torch.empty(vocab)  # top-p: cumulative mass, then mass before each sorted entry
        self.order = torch.empty(vocab, dtype=torch.int64)  # top-p: sort permutation
        self.mask = torch.empty(vocab, dtype=torch.bool)
        self.dist = torch.empty(vocab, dtype=torch.float64)  # the draw: the row in fp64, then its cdf
        self.probs64 = torch.empty(vocab, dtype=torch.float64)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.row, self.probs, self.sorted, self.cum, self.order,
                                                          self.mask, self.dist, self.probs64))


def first_max(row: torch.Tensor) -> int:
    """The id of the row's first largest entry, as torch.argmax gives it (numpy's SIMD argmax is faster on CPU)."""
    return int(row.numpy().argmax())


def first_max_of_rows(rows: torch.Tensor) -> list[int]:
    """``first_max`` of each row of [B, V]."""
    return rows.numpy().argmax(-1).tolist()


# The finite entries of a filtered row as ascending token ids, where a filter knows them without another pass
# over the row; None where it does not (no filter, min-p, a tie at the k-th value).
Kept = Optional[torch.Tensor]


def _top_k(row: torch.Tensor, k: int, ws: SamplerWorkspace) -> Kept:
    """Set to -inf every entry below the k-th largest, in place (ties with it stay)."""
    vals, ids = torch.topk(row, k + 1)
    kth = vals[k - 1]
    if kth == float("-inf"):  # fewer than k finite entries (a grammar's mask): they are all kept, nothing changes
        return ids[:int(torch.isfinite(vals).sum())].sort().values
    if vals[k] < kth:  # exactly k entries reach the k-th value: they are topk's k ids
        kept = ids[:k].sort().values
        kept_vals = row[kept]
        row.fill_(float("-inf"))
        row.index_copy_(0, kept, kept_vals)
        return kept
    torch.lt(row, kth, out=ws.mask)
    row.masked_fill_(ws.mask, float("-inf"))
    return None


def _min_p(row: torch.Tensor, min_p: float, ws: SamplerWorkspace) -> None:
    """Set to -inf every entry whose probability is under min_p times the top one's, in place."""
    torch.softmax(row, dim=-1, out=ws.probs)
    torch.lt(ws.probs, min_p * ws.probs.max(), out=ws.mask)
    row.masked_fill_(ws.mask, float("-inf"))


def _top_p(row: torch.Tensor, top_p: float, cut: bool, kept: Kept, ws: SamplerWorkspace) -> Kept:
    """Set to -inf every token outside the nucleus, in place.

    The nucleus is every entry of the row sorted descending whose mass before
    it (in that order) is under ``top_p``; the first entry always stays.
    Equal logits keep token-id order (a stable sort), so where the boundary
    falls inside a run of ties the lower ids stay.
    """
    if cut:
        return _top_p_of_finite(row, top_p, kept, ws)
    if not _top_p_by_value(row, top_p, ws):
        _top_p_by_permutation(row, top_p, ws)
    return None


def _top_p_of_finite(row: torch.Tensor, top_p: float, kept: Kept, ws: SamplerWorkspace) -> torch.Tensor:
    """Top-p over a row an earlier filter cut: only its finite entries are sorted.

    -inf entries sort last and weigh exactly 0, so the softmax and the
    cumulative sum of the finite prefix are the same bits as over the whole
    sorted row. Returns the ids left, ascending.
    """
    if kept is None:
        torch.gt(row, float("-inf"), out=ws.mask)
        kept = ws.mask.nonzero().squeeze(1)  # ascending token ids
    vals, pos = torch.sort(row[kept], descending=True, stable=True)
    probs = torch.softmax(vals, dim=-1)
    drop = (probs.cumsum(-1) - probs) >= top_p
    drop[0] = False
    row.index_fill_(0, kept[pos[drop]], float("-inf"))
    return kept[pos[~drop]].sort().values


def _top_p_by_value(row: torch.Tensor, top_p: float, ws: SamplerWorkspace) -> bool:
    """Top-p from the row's values sorted without their ids; False (row untouched) if it cannot say.

    The softmax and the mass before each entry depend on the sorted values
    only, not on which ids hold them, so numpy's in-place sort of the values
    (a SIMD sort, several times faster than a sort that tracks ids) gives the
    same bits as the stable sort. The kept positions are a prefix of n
    entries (along the sorted row the cumulative mass does not fall and an
    entry's own mass does not grow), i.e. every id whose value beats the n-th
    and, of a run of equal values that the boundary splits, its lowest ids.
    Were the kept positions not a prefix, the caller sorts with ids instead.
    """
    vocab = row.shape[-1]
    torch.neg(row, out=ws.sorted)
    ws.sorted.numpy().sort()  # ascending -row, in place
    ws.sorted.neg_()  # the row's values, descending
    torch.softmax(ws.sorted, dim=-1, out=ws.probs)
    torch.cumsum(ws.probs, -1, out=ws.cum)
    ws.cum.sub_(ws.probs)
    torch.ge(ws.cum, top_p, out=ws.mask)  # dropped positions
    ws.mask[0] = False
    n = vocab - int(ws.mask.sum())
    if n == vocab:
        return True
    if bool(ws.mask[:n].any()):
        return False
    last = ws.sorted[n - 1]
    torch.lt(row, last, out=ws.mask)
    row.masked_fill_(ws.mask, float("-inf"))
    if bool(ws.sorted[n] == last):  # the boundary splits a run of equal values: keep its lowest ids
        above = int((ws.sorted > last).sum())
        run = (row == last).nonzero().squeeze(1)
        row.index_fill_(0, run[n - above:], float("-inf"))
    return True


def _top_p_by_permutation(row: torch.Tensor, top_p: float, ws: SamplerWorkspace) -> None:
    """Top-p through the stable sort's permutation: every position's own decision, whatever the pattern."""
    torch.sort(row, descending=True, stable=True, out=(ws.sorted, ws.order))
    torch.softmax(ws.sorted, dim=-1, out=ws.probs)
    torch.cumsum(ws.probs, -1, out=ws.cum)
    ws.cum.sub_(ws.probs)
    torch.ge(ws.cum, top_p, out=ws.mask)
    ws.mask[0] = False
    ws.sorted.masked_fill_(ws.mask, float("-inf"))
    row.scatter_(0, ws.order, ws.sorted)  # a permutation: every entry rewritten, the kept ones unchanged


def filter_row(row: torch.Tensor, params: SamplingParams, ws: SamplerWorkspace) -> Kept:
    """Temperature-scale the row and set disallowed tokens to -inf, in place."""
    row.div_(params.temperature)
    kept, cut = None, False
    if 0 < params.top_k < row.shape[-1]:
        kept, cut = _top_k(row, params.top_k, ws), True
    if params.min_p > 0.0:
        _min_p(row, params.min_p, ws)
        kept, cut = None, True
    if params.top_p < 1.0:
        kept = _top_p(row, params.top_p, cut, kept, ws)
    return kept


def draw(row: torch.Tensor, generator: torch.Generator, kept: Kept, ws: SamplerWorkspace) -> int:
    """One inverse-cdf draw from softmax(row) in fp64: exactly one uniform from ``generator``."""
    vocab = row.shape[-1]
    ws.dist.copy_(row)
    torch.softmax(ws.dist, dim=-1, out=ws.probs64)
    if kept is None:
        cdf = torch.cumsum(ws.probs64, -1, out=ws.dist)
    else:
        cdf = ws.probs64[kept].cumsum(-1)  # the whole row's cdf at the kept ids: the ids between add exact zeros
    u = torch.rand((), generator=generator, dtype=torch.float64) * cdf[-1]
    j = int(torch.searchsorted(cdf, u.reshape(1), right=True)[0])
    if kept is None:
        return min(j, vocab - 1)
    return int(kept[j]) if j < kept.shape[0] else vocab - 1  # past the end: the whole row's search clamps there
