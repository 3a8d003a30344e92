"""Greedy rounds take their argmax where the logits are: the same tokens as the host sampler.

On CUDA the runner copies only the tokens of a round whose rows are all plain
greedy (no penalties, no logprobs); any other round copies the rows and
samples on the host. On the CPU the path is forced on to compare the two.
"""

from __future__ import annotations

import pytest
import torch

from ignis.engine.models.build import load_model
from ignis.shared.demo import ensure_demo_model
from tests.engine.test_reuse import Engine, prompt


@pytest.fixture(scope="module")
def model():
    m, _ = load_model(ensure_demo_model())
    return m


def tokens_of(model, on_device: bool, with_ties: bool = False) -> dict[str, list[int]]:
    eng = Engine(model, reuse=False)
    eng.runner.greedy_on_device = on_device
    if with_ties:  # equal maxima everywhere: the first of them must win on both paths
        model.head = lambda x: torch.zeros_like(type(model).head(model, x))
    try:
        for i in range(3):
            eng.submit(f"r{i}", prompt(70 + 40 * i, 5 + i), max_tokens=8)
        eng.run()
    finally:
        model.__dict__.pop("head", None)
    return eng.tokens


def test_greedy_tokens_on_device_match_the_host_sampler(model):
    assert tokens_of(model, True) == tokens_of(model, False)


def test_ties_go_to_the_first_largest_entry_on_both_paths(model):
    got = tokens_of(model, True, with_ties=True)
    assert got == tokens_of(model, False, with_ties=True)
    assert all(t == 0 for toks in got.values() for t in toks)
