"""The vocabulary-wide steps of sampling one row, done in place in a workspace reused across rows and rounds.

Temperature, top-k, min-p and top-p set disallowed tokens of a working row to
-inf; ``draw`` picks from what is left by a Gumbel-max race keyed by one
uniform of the request's generator (below). Every step
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
        self.dist = torch.empty(vocab, dtype=torch.float64)  # the draw: each id's race score
        self.ids = torch.arange(vocab, dtype=torch.int64)  # the draw: every token id, once
        self.bits = torch.empty(vocab, dtype=torch.int64)  # the draw: each id's hash
        self.shifted = torch.empty(vocab, dtype=torch.int64)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.row, self.probs, self.sorted, self.cum, self.order,
                                                          self.mask, self.dist, self.ids, self.bits, self.shifted))


class NoTokenLeft(ValueError):
    """A request's own constraints rule out every token of a step (a grammar beside ``allowed_token_ids``
    or ``bad_words`` that allow none of its tokens, a ``logit_bias`` of -inf on all of them, ...)."""

    def __init__(self):
        super().__init__("the request's constraints leave no token to sample: its grammar (response_format, "
                         "structured_outputs, a tool call's), allowed_token_ids, bad_words and logit_bias "
                         "together rule out every token")


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


# splitmix64's constants as signed int64 (torch has no uint64 arithmetic; int64 products wrap the same bits)
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)
_STEPS = ((30, _MIX1), (27, _MIX2), (31, None))


def race_uniforms(key: int, ids: torch.Tensor, out: torch.Tensor | None = None,
                  bits: torch.Tensor | None = None, shifted: torch.Tensor | None = None) -> torch.Tensor:
    """One uniform in (0, 1), fp64, per token id: splitmix64 of ``key + id * golden``, a pure function of
    the two (so an id's uniform does not depend on which other ids are in the race). ``out``, ``bits``,
    ``shifted``: buffers shaped as ``ids`` (else fresh tensors)."""
    x = torch.mul(ids, _GOLDEN, out=bits) if bits is not None else ids * _GOLDEN
    x.add_(key)
    t = shifted if shifted is not None else torch.empty_like(x)
    for shift, mult in _STEPS:
        torch.bitwise_right_shift(x, shift, out=t)
        t.bitwise_and_((1 << (64 - shift)) - 1)  # a logical shift: the sign bits the arithmetic one copies, off
        x.bitwise_xor_(t)
        if mult is not None:
            x.mul_(mult)
    torch.bitwise_right_shift(x, 11, out=t)
    t.bitwise_and_((1 << 53) - 1)
    u = out if out is not None else torch.empty(ids.shape, dtype=torch.float64)
    u.copy_(t)
    return u.add_(0.5).mul_(2.0 ** -53)


def race_key(generator: torch.Generator) -> int:
    """The key of one race: exactly one uniform of ``generator``, as 53 bits."""
    return int(torch.rand((), generator=generator, dtype=torch.float64) * 2.0 ** 53)


def peek_race_keys(generator: torch.Generator, n: int) -> list[int]:
    """The keys of ``generator``'s next ``n`` races, leaving it where it was (a drafter races under the keys
    the request's next tokens will be drawn with)."""
    state = generator.get_state()
    keys = [race_key(generator) for _ in range(n)]
    generator.set_state(state)
    return keys


def draw(row: torch.Tensor, generator: torch.Generator, kept: Kept, ws: SamplerWorkspace) -> int:
    """One draw from softmax(row): the id of the largest ``row[i] + g_i``, ``g_i = -log(-log(u_i))`` a
    Gumbel variable from ``race_uniforms`` (the Gumbel-max race: exactly softmax's distribution), keyed by
    exactly one uniform from ``generator`` (``race_key``; ``draw_keyed`` runs the race).

    A race, not an inverse-cdf draw over the row in token-id order: a logit that moves by a rounding error
    (a resumed prefill sums in another order, a batch of another size) changes the pick only when the two
    best scores are that close, where an inverse-cdf walk over 248K ids moved a boundary across the uniform
    about once in a hundred tokens of a broad distribution (a seeded answer then differed warm and cold).
    """
    return draw_keyed(row, race_key(generator), kept, ws)


def draw_keyed(row: torch.Tensor, key: int, kept: Kept, ws: SamplerWorkspace) -> int:
    """The winner of the race over softmax(row) under ``key`` (``draw``)."""
    if kept is None:
        torch.gt(row, float("-inf"), out=ws.mask)
        finite = int(ws.mask.sum())
        if not finite:
            raise NoTokenLeft()
        if finite * 4 < row.shape[-1]:  # a filter left few: race those alone (the same winner)
            kept = ws.mask.nonzero().squeeze(1)
    if kept is None:
        score = race_uniforms(key, ws.ids, ws.dist, ws.bits, ws.shifted)
        score.log_().neg_().log_().neg_().add_(row)  # -inf entries stay -inf
        return first_max(score)
    score = race_uniforms(key, kept).log_().neg_().log_().neg_().add_(row[kept])
    return int(kept[first_max(score)])
