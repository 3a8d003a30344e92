"""Speculative decoding (engine.spec_decode, engine.spec_round): greedy output identical to plain decode."""

from __future__ import annotations

import pytest
import torch

from tests.engine.spec_driver import generate, load

VOCAB = 128
GREEDY = {"temperature": 0.0}


def prompts(seed: int, lengths=(5, 70, 23, 130, 9)) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(2, VOCAB, (n,), generator=gen).tolist() for n in lengths]


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_random_head_greedy_output_is_plain_decode(checkpoint_factory, family):
    """A random head is mostly rejected: every round rolls lanes back; output must not change."""
    model, head = load(checkpoint_factory(family, mtp="full").path)
    ps = prompts(1)
    limits = [24, 7, 31, 2, 18]  # max_tokens cuts some lanes' drafts short
    want, _ = generate(model, head, ps, k=0, max_tokens=limits, sampling=GREEDY)
    for k in (1, 2, 3):
        got, accepted = generate(model, head, ps, k=k, max_tokens=limits, sampling=GREEDY)
        assert got == want, f"K={k}"
        assert accepted, "no speculative decode ran"
