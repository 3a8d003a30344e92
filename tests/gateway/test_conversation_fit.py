"""gateway.conversation_fit alone: which turns a conversation past the context loses."""

from __future__ import annotations

from ignis.gateway.conversation_fit import cut_points, fit_messages


def conv():
    return [{"role": "system", "content": "s" * 10},
            {"role": "user", "content": "a" * 100},
            {"role": "assistant", "content": "b" * 100},
            {"role": "user", "content": "c" * 100},
            {"role": "assistant", "tool_calls": [{"id": "1"}], "content": "d" * 50},
            {"role": "tool", "tool_call_id": "1", "content": "e" * 50},
            {"role": "user", "content": "f" * 100}]


def length(messages):
    return sum(len(m.get("content", "")) for m in messages)


def test_a_conversation_that_fits_is_left_whole():
    assert fit_messages(conv(), length, 510) == (conv(), 0)


def test_the_earliest_cut_that_fits_keeps_the_system_and_opens_with_a_user_turn():
    kept, dropped = fit_messages(conv(), length, 400)
    assert dropped == 2 and [m["content"][0] for m in kept] == ["s", "c", "d", "e", "f"]
    kept, dropped = fit_messages(conv(), length, 200)  # only the last user turn onward fits
    assert dropped == 5 and [m["content"][0] for m in kept] == ["s", "f"]


def test_a_tool_result_is_never_kept_without_its_call():
    _, points = cut_points(conv())
    assert points == [3, 6]  # cuts fall only before user turns (not the first: no cut at all)
    kept, _ = fit_messages(conv(), length, 320)
    assert [m["role"] for m in kept] == ["system", "user", "assistant", "tool", "user"]


def test_no_cut_that_fits_leaves_the_conversation_whole():
    assert fit_messages(conv(), length, 50) == (conv(), 0)  # the request then fails as without truncation
    lone = [{"role": "user", "content": "x" * 900}]
    assert fit_messages(lone, length, 100) == (lone, 0)


def test_bisection_renders_a_few_times_not_once_per_turn():
    long = [{"role": "system", "content": "s"}] + [{"role": r, "content": "x" * 10}
                                                   for _ in range(200) for r in ("user", "assistant")]
    calls = []

    def counted(messages):
        calls.append(len(messages))
        return length(messages)

    kept, dropped = fit_messages(long, counted, 105)
    assert length(kept) <= 105 and length(long[:1] + long[1 + dropped - 2:]) > 105  # the earliest cut that fits
    assert len(calls) <= 10
