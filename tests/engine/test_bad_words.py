"""Bad-word sequences: exactly the ids their prefixes ban after a given output tail."""

from __future__ import annotations

from ignis.engine.bad_words import BadWords


def test_a_one_id_word_is_banned_at_every_step():
    words = BadWords(((7,),))
    assert words.banned(()) == [7] and words.banned((1, 2, 3)) == [7]
    assert words.longest_prefix == 0


def test_a_longer_word_bans_its_last_id_only_after_its_prefix():
    words = BadWords(((4, 5, 6),))
    assert words.longest_prefix == 2
    assert words.banned(()) == []
    assert words.banned((4,)) == []  # the prefix is not out yet
    assert words.banned((4, 5)) == [6]
    assert words.banned((9, 4, 5)) == [6]
    assert words.banned((4, 5, 9)) == []  # the prefix must end the output
    assert words.banned((5, 4)) == []


def test_several_words_ban_together_and_share_prefixes():
    words = BadWords(((3,), (1, 2), (1, 8), (9, 1, 2), (5, 1, 4)))
    assert words.banned((0,)) == [3]
    assert words.banned((7, 1)) == [2, 3, 8]
    assert words.banned((9, 1)) == [2, 3, 8]  # (9, 1, 2) asks for the same 2 as (1, 2)
    assert words.banned((5, 1)) == [2, 3, 4, 8]  # and (5, 1, 4) its 4
    assert words.banned((0, 9, 1)) == [2, 3, 8]
    assert BadWords(((9, 1, 2),)).banned((0, 1)) == []
    assert BadWords(((5, 1, 4),)).banned((5, 1)) == [4]
    assert BadWords(((5, 1, 4),)).banned((6, 1)) == []
