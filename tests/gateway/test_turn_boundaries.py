"""Common prefixes and turn starts on hand-made token sequences (ChatML, Llama-3 and [INST] headers)."""

from __future__ import annotations

import random

import pytest

from ignis.gateway.turn_boundaries import HEADER_TOKENS, common_prefix_len, turn_start

# token ids: 1000+ are added tokens; 7 spells "user"
IM_START, IM_END, START_HEADER, END_HEADER, EOT, INST = 1000, 1001, 1002, 1003, 1004, 1005
USER, NL, NLNL = 7, 10, 11
ADDED = {IM_START, IM_END, START_HEADER, END_HEADER, EOT, INST}


def names_user(t: int) -> bool:
    return t == USER


@pytest.mark.parametrize("seed", range(20))
def test_common_prefix_len_matches_a_plain_scan(seed):
    rng = random.Random(seed)
    a = [rng.randrange(3) for _ in range(rng.randrange(0, 60))]
    b = a[:rng.randrange(0, len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(0, 10))]
    want = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert common_prefix_len(a, b) == want
    assert common_prefix_len("".join(map(str, a)), "".join(map(str, b))) == want


@pytest.mark.parametrize("ids,want", [
    ([IM_START, 50, 51, IM_END, NL, IM_START, USER, NL], 5),                       # ChatML
    ([START_HEADER, 50, END_HEADER, 51, EOT, START_HEADER, USER, END_HEADER, NLNL], 5),  # Llama 3
    ([50, 51, 52, INST], 3),                                                          # [INST], no role name
    ([IM_START, USER, NL], 0),                                                        # nothing before the turn
])
def test_turn_start_finds_the_header(ids, want):
    assert turn_start(ids, len(ids), ADDED, names_user) == want


def test_no_added_token_near_the_end_is_no_boundary():
    ids = [IM_START] + [50] * HEADER_TOKENS + [USER, NL]
    assert turn_start(ids, len(ids), ADDED, names_user) is None
    assert turn_start([50, 51, USER, NL], 4, ADDED, names_user) is None
