"""The engine's profiler over served rounds (``engine.profiling``), with the real torch profiler on the CPU."""

from __future__ import annotations

import json

import torch

from ignis.engine.profiling import RoundProfiler
from ignis.shared.wire import Profile, Profiled


class Answers:
    def __init__(self):
        self.sent: list[Profiled] = []

    def __call__(self, msg, peer):
        assert peer == b"gw"
        self.sent.append(msg)

    @property
    def last(self) -> Profiled:
        return self.sent[-1]


def _rounds(profiler: RoundProfiler, n: int) -> None:
    a = torch.randn(32, 32)
    for _ in range(n):
        with profiler.round():
            torch.mm(a, a)


def test_a_profile_covers_the_rounds_between_start_and_stop(tmp_path):
    answers = Answers()
    p = RoundProfiler(str(tmp_path / "prof"), "main", answers)
    _rounds(p, 2)  # not profiling: nothing recorded, nothing written
    p.handle(b"gw", Profile("a", True))
    assert answers.last == Profiled("a", True, "profiling") and p.active
    _rounds(p, 3)
    p.handle(b"gw", Profile("b", False))
    done = answers.last
    assert done.ok and done.message == "profiled 3 rounds" and not p.active
    assert done.trace.startswith(str(tmp_path / "prof" / "ignis-engine-main-")) and done.trace.endswith(".trace.json")
    events = json.loads(open(done.trace).read())["traceEvents"]
    assert sum(1 for e in events if e.get("name") == "ignis.round") == 3
    assert sum(1 for e in events if e.get("name") == "aten::mm") == 3
    summary = open(done.summary).read()
    assert summary.startswith("3 rounds in ") and "aten::mm" in summary


def test_a_round_count_stops_it_and_a_later_stop_names_its_files(tmp_path):
    answers = Answers()
    p = RoundProfiler(str(tmp_path), "main", answers)
    p.handle(b"gw", Profile("a", True, rounds=2))
    _rounds(p, 5)
    assert not p.active
    p.handle(b"gw", Profile("b", False))
    assert answers.last.ok and answers.last.message.startswith("profiled 2 rounds")
    events = json.loads(open(answers.last.trace).read())["traceEvents"]
    assert sum(1 for e in events if e.get("name") == "ignis.round") == 2
    p.handle(b"gw", Profile("c", False))  # claimed once
    assert answers.last == Profiled("c", False, "the engine is not profiling")


def test_refusals_and_shutdown(tmp_path):
    answers = Answers()
    off = RoundProfiler(None, "main", answers)
    off.handle(b"gw", Profile("a", True))
    assert answers.last == Profiled("a", False, "profiling is off: start the engine with --profile-dir DIR")
    off.handle(b"gw", Profile("a2", False))  # a stop says why too
    assert answers.last == Profiled("a2", False, "profiling is off: start the engine with --profile-dir DIR")
    p = RoundProfiler(str(tmp_path), "main", answers)
    p.handle(b"gw", Profile("b", True))
    p.handle(b"gw", Profile("c", True))
    assert not answers.last.ok and answers.last.message.startswith("the engine is already profiling")
    _rounds(p, 1)
    p.close()  # the engine stops: the profile is written
    assert not p.active and len(list(tmp_path.glob("*.trace.json"))) == 1
    blocked = RoundProfiler(str(tmp_path / "prof.txt" / "x"), "main", answers)
    (tmp_path / "prof.txt").write_text("a file where the directory would be")
    blocked.handle(b"gw", Profile("d", True))
    assert not answers.last.ok and answers.last.message.startswith("--profile-dir ")


def test_two_profiles_in_one_second_keep_their_own_files(tmp_path, monkeypatch):
    """Both were named by the second they stopped in: the second overwrote the first."""
    import time as time_module

    monkeypatch.setattr(time_module, "strftime", lambda fmt, *a: "20261207-212719")
    answers = Answers()
    p = RoundProfiler(str(tmp_path), "main", answers)
    traces = []
    for i in range(3):
        p.handle(b"gw", Profile(f"start{i}", True))
        _rounds(p, 1)
        p.handle(b"gw", Profile(f"stop{i}", False))
        traces.append(answers.last.trace)
    assert len(set(traces)) == 3 and all(traces)
    assert sorted(path.name for path in tmp_path.glob("*.trace.json")) == [
        "ignis-engine-main-20261207-212719-2.trace.json", "ignis-engine-main-20261207-212719-3.trace.json",
        "ignis-engine-main-20261207-212719.trace.json"]
