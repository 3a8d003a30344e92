"""vLLM's bad words in the sampler: which ids a request may not sample next, given its output so far.

A bad word arrives as token sequences (``SamplingParams.bad_words``, tokenized
by the gateway). A sequence ``(w0, ..., w[n-1])`` bans its last id ``w[n-1]``
at a step where the request's generated tokens end with ``w0 .. w[n-2]``; a
one-id sequence bans its id at every step. Only generated tokens count, never
the prompt (as vLLM's sampler does):

    generated  ... a  b  c | next
    sequence         b  c  d         ->  d is banned at this step

``BadWords`` groups the sequences by their prefix so a step costs one tuple
lookup per distinct prefix length. Pure Python; the sampler sets the banned
ids to -inf.
"""

from __future__ import annotations

from collections.abc import Iterable


class BadWords:
    """A request's bad-word sequences, ready to answer ``banned(tail)``."""

    def __init__(self, sequences: tuple[tuple[int, ...], ...]):
        self.always: tuple[int, ...] = tuple(sorted({s[0] for s in sequences if len(s) == 1}))
        # prefix length -> {prefix: last ids banned after it}
        self.after: dict[int, dict[tuple[int, ...], set[int]]] = {}
        for s in sequences:
            if len(s) > 1:
                self.after.setdefault(len(s) - 1, {}).setdefault(tuple(s[:-1]), set()).add(s[-1])
        self.longest_prefix = max(self.after, default=0)
        """How many of the latest generated tokens a step looks at."""

    def banned(self, tail: Iterable[int]) -> list[int]:
        """The ids banned at the next step, ascending; ``tail``: the latest generated tokens (at least
        ``longest_prefix`` of them once that many are out; fewer while the output is shorter)."""
        tail = tuple(tail)
        out = set(self.always)
        for n, prefixes in self.after.items():
            if len(tail) >= n:
                out |= prefixes.get(tuple(tail[len(tail) - n:]), set())
        return sorted(out)
