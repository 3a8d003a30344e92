"""``Fields``: what it reads is remembered, so the fields nothing asked for can be reported."""

from __future__ import annotations

import pytest

from ignis.gateway.errors import ApiError
from ignis.gateway.fields import Fields


def test_unread_is_what_no_accessor_asked_for_nulls_and_failed_reads_aside():
    f = Fields({"a": 1, "b": "x", "c": None, "d": [1], "e": True, "typo": 3})
    assert f.int("a") == 1 and f.str("b") == "x" and f.has("d")
    assert f.bool("missing") is False  # asked for, absent: nothing to report
    assert f.unread() == ["e", "typo"]  # c is null: not sent, as OpenAI clients send unset options
    with pytest.raises(ApiError):
        f.str("e")  # a field read and refused is read
    assert f.unread() == ["typo"]
    assert f.object("nested") is None and f.raw("typo") == 3
    assert f.unread() == []


def test_a_nested_object_keeps_its_own_reads():
    f = Fields({"outer": {"x": 1, "y": 2}})
    inner = f.object("outer")
    inner.int("x")
    assert f.unread() == [] and inner.unread() == ["y"]
