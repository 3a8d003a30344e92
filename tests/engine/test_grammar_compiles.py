"""Grammars compiled off the engine loop: the waiting requests, shared compiles, and the loop going on.

The unit tests drive ``GrammarCompiles`` with a cache whose compile waits on an
event. The process test runs a real engine: a lane already decoding must keep
receiving tokens while a grammar of 20,000 alternatives compiles (about a
second; the library lets go of the interpreter lock while it compiles); the
constrained requests then run as before, a bad grammar is refused after its
compile, and one aborted while its grammar compiles ends with nothing
generated. Nothing is timed: the test counts the free lane's tokens.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ignis.engine.grammar_cache import GrammarError
from ignis.engine.grammar_compiles import GrammarCompiles
from ignis.gateway.grammars import choice_grammar
from ignis.shared.demo.tokenizer import added_token_id
from ignis.shared.wire import Generate, SamplingParams
from tests.engine.engine_process import EngineProcess

EOS_IDS = (added_token_id("<|im_end|>"), added_token_id("<|endoftext|>"))


class GatedCache:
    """A grammar cache whose compiles wait for ``gate``; "bad" grammars fail, "boom" raises."""

    def __init__(self):
        self.gate = threading.Event()
        self.compiled: list[str] = []
        self.kept: dict[str, object] = {}

    def compile(self, text: str):
        self.gate.wait(10)
        self.compiled.append(text)
        if text == "bad":
            raise GrammarError("no rule named bad")
        if text == "boom":
            raise RuntimeError("library panic")
        return f"template:{text}"

    def keep(self, text: str, template) -> None:
        self.kept[text] = template


class Lanes:
    def __init__(self):
        self.cache = GatedCache()


def gen(rid: str, grammar: str) -> Generate:
    return Generate(rid, (1, 2, 3), SamplingParams(max_tokens=4), grammar=grammar)


def finish_all(compiles: GrammarCompiles, woken: threading.Semaphore, jobs: int) -> list:
    """Every ``Compiled`` of ``jobs`` compiles, waiting on the wake-ups (never on a clock)."""
    done = []
    for _ in range(jobs):
        assert woken.acquire(timeout=10), "a compile never ended"
    done.extend(compiles.finished())
    return done


def test_requests_naming_one_text_share_a_compile_and_wait_until_it_ends():
    woken = threading.Semaphore(0)
    compiles = GrammarCompiles(woken.release)
    lanes = Lanes()
    a, b, c = gen("a", "g1"), gen("b", "g1"), gen("c", "g2")
    for msg in (a, b, c):
        compiles.start(b"peer", msg, lanes)
    assert len(compiles) == 3 and compiles.in_flight == 2 and "b" in compiles
    assert list(compiles.finished()) == []  # nothing has ended: nothing is given, nothing is cached
    assert lanes.cache.kept == {}
    lanes.cache.gate.set()
    done = finish_all(compiles, woken, 2)
    assert [[m.id for _, m in d.requests] for d in done] == [["a", "b"], ["c"]]
    assert all(d.error is None and d.seconds >= 0 for d in done)
    assert lanes.cache.compiled == ["g1", "g2"]  # once per text
    assert lanes.cache.kept == {"g1": "template:g1", "g2": "template:g2"}
    assert len(compiles) == 0 and compiles.in_flight == 0
    compiles.close()


def test_errors_are_given_to_their_requests_and_nothing_is_cached():
    woken = threading.Semaphore(0)
    compiles = GrammarCompiles(woken.release)
    lanes = Lanes()
    lanes.cache.gate.set()
    compiles.start(b"p", gen("x", "bad"), lanes)
    compiles.start(b"p", gen("y", "boom"), lanes)
    done = {d.requests[0][1].id: d for d in finish_all(compiles, woken, 2)}
    assert "no rule named bad" in str(done["x"].error)
    assert "library failed" in str(done["y"].error) and "library panic" in str(done["y"].error)
    assert lanes.cache.kept == {}
    compiles.close()


def test_a_withdrawn_request_is_not_given_back_and_its_reused_id_waits_for_its_own_grammar():
    woken = threading.Semaphore(0)
    compiles = GrammarCompiles(woken.release)
    lanes = Lanes()
    first = gen("r", "g1")
    compiles.start(b"p", first, lanes)
    assert compiles.withdraw("r") == (b"p", first)
    assert compiles.withdraw("r") is None
    again = gen("r", "g2")  # the id comes back with another grammar
    compiles.start(b"p", again, lanes)
    lanes.cache.gate.set()
    done = finish_all(compiles, woken, 2)
    given = [(m.id, m.grammar) for d in done for _, m in d.requests]
    assert given == [("r", "g2")]  # g1's compile ended with nobody waiting; its template is kept all the same
    assert set(lanes.cache.kept) == {"g1", "g2"}
    compiles.close()


def test_withdraw_all_empties_the_wait():
    compiles = GrammarCompiles(lambda: None)
    lanes = Lanes()
    compiles.start(b"p", gen("a", "g1"), lanes)
    compiles.start(b"q", gen("b", "g1"), lanes)
    assert sorted(m.id for _, m in compiles.withdraw_all()) == ["a", "b"]
    assert len(compiles) == 0
    lanes.cache.gate.set()
    compiles.close()


class FakeLanes(Lanes):
    """Grammar lanes whose ``constrained`` finds what the compiles kept."""

    def __init__(self):
        super().__init__()
        self.matchers: dict[str, str] = {}

    def constrained(self, rid: str, grammar: str) -> bool:
        if grammar not in self.cache.kept:
            return False
        self.matchers[rid] = self.cache.kept[grammar]
        return True


def intake_with(lanes: FakeLanes, woken: threading.Semaphore):
    """An Intake over a loaded fake runtime whose scheduler takes every request; (intake, sent, scheduled)."""
    from ignis.engine.intake import Intake
    from ignis.engine.metrics import EngineMetrics
    from ignis.engine.served_models import ServedModels
    from ignis.shared.stop_request import StopRequest

    sent, scheduled, tracked = [], [], {}
    channel = SimpleNamespace(send=lambda msg, peer: sent.append(msg))
    scheduler = SimpleNamespace(config=SimpleNamespace(page_tokens=64, max_model_len=4096),
                                store=SimpleNamespace(enabled=True),
                                add=lambda req: scheduled.append(req.req_id))
    runtime = SimpleNamespace(name="m", vocab_size=100, scheduler=scheduler,
                              runner=SimpleNamespace(grammars=lanes, release=lambda rid: None))
    streams = SimpleNamespace(tracked=tracked, track=lambda peer, msg: tracked.setdefault(msg.id, peer))
    intake = Intake(channel, EngineMetrics("m"), ServedModels(runtime), streams, StopRequest(), max_queue=8,
                    wake=woken.release)
    return intake, sent, scheduled


def test_intake_holds_a_request_while_its_grammar_compiles_then_schedules_it_or_ends_it():
    woken = threading.Semaphore(0)
    lanes = FakeLanes()
    intake, sent, scheduled = intake_with(lanes, woken)
    intake.generate(b"p", gen("a", "g1"))
    intake.generate(b"p", gen("b", "g1"))
    intake.generate(b"p", gen("b", "g2"))  # its id waits already
    assert intake.num_waiting == 2 and scheduled == []
    assert sent[-1].reason == "bad_request" and "already in use" in sent[-1].message
    assert intake.abort_pending("b")
    assert sent[-1].id == "b" and sent[-1].finish_reason == "abort" and intake.num_waiting == 1
    intake.compiled()  # nothing has ended: nothing moves
    assert scheduled == [] and intake.num_waiting == 1
    lanes.cache.gate.set()
    assert woken.acquire(timeout=10)
    intake.compiled()
    assert scheduled == ["a"] and lanes.matchers == {"a": "template:g1"} and intake.num_waiting == 0
    intake.generate(b"p", gen("c", "g1"))  # cached: scheduled at once, no compile
    assert scheduled == ["a", "c"] and intake.compiles.in_flight == 0
    intake.generate(b"q", gen("d", "bad"))
    assert woken.acquire(timeout=10)
    intake.compiled()
    assert sent[-1].id == "d" and "does not compile" in sent[-1].message and "no rule named bad" in sent[-1].message
    intake.generate(b"q", gen("e", "g3"))
    intake.refuse_compiling("shutting_down", "the engine is shutting down")
    assert sent[-1].id == "e" and sent[-1].reason == "shutting_down" and intake.num_waiting == 0
    intake.compiles.close()


# ----- a real engine: its first grammar does not stop the other lanes ----------------------------------------


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.fixture
def engine(tmp_path):
    eng = EngineProcess(tmp_path, "--decode-lanes", "8", "--kv-pool-tokens", "8192", "--metrics-port", "0")
    yield eng
    assert eng.stop() == 0


def test_a_lane_decodes_on_while_a_large_grammar_compiles(engine):
    port = next(int(line.rsplit(":", 1)[1].split("/")[0]) for line in engine.log_text().splitlines()
                if "metrics on http://" in line)
    enum = '{"grammars": [{"json_schema": {"enum": ["yes", "no"]}}]}'
    first = engine.run("first", list(range(10, 20)), max_tokens=20, grammar=enum)  # builds the vocabulary's view
    assert first.finished.finish_reason == "stop" and first.tokens[-1] in EOS_IDS
    out = engine.outcomes
    engine.generate("free", list(range(20, 60)), max_tokens=4000, ignore_eos=True)
    deadline = time.monotonic() + 120
    while len(out["free"].tokens) < 2:
        assert time.monotonic() < deadline, engine.log_text()
        engine.pump()
    large = choice_grammar([f"entry {i} of a long list of choices" for i in range(20000)])  # ~1 s to compile
    at_send = len(out["free"].tokens)
    engine.generate("large", list(range(30, 40)), max_tokens=40, temperature=1.0, seed=3, grammar=large)
    engine.generate("same", list(range(40, 50)), max_tokens=40, grammar=large)
    engine.generate("bad", list(range(50, 60)), max_tokens=8, grammar="start: missing_rule")
    engine.generate("gone", list(range(60, 70)), max_tokens=8, grammar='start: "a" | "b"')
    engine.abort("gone")
    while not out["large"].tokens and not out["large"].done:
        assert time.monotonic() < deadline, engine.log_text()
        engine.pump()
    during = len(out["free"].tokens) - at_send
    # Compiled at intake on the loop, the large grammar held every round: the free lane's next token came in
    # the same batch as the constrained request's first.
    assert during >= 10, f"the free lane got {during} tokens while a large grammar compiled"
    done = engine.wait(["large", "same", "bad", "gone"])
    for rid in ("large", "same"):
        assert done[rid].finished.finish_reason == "stop" and done[rid].tokens[-1] in EOS_IDS, (rid, done[rid].finished)
    assert done["bad"].refused.reason == "bad_request" and "missing_rule" in done["bad"].refused.message
    assert done["gone"].finished.finish_reason == "abort" and done["gone"].tokens == []
    engine.abort("free")
    assert engine.wait(["free"])["free"].finished.finish_reason == "abort"
    compiled = scrape(port)["ignis:grammar_compile_seconds_count"]
    assert compiled == 4  # the enum, the large one (shared by two), the bad one, gone's
    again = engine.run("again", list(range(70, 80)), max_tokens=20, grammar=enum)  # cached: no compile
    assert again.finished.finish_reason == "stop"
    assert scrape(port)["ignis:grammar_compile_seconds_count"] == compiled


def test_the_vocabulary_built_at_load_is_ready_before_the_engine_is(tmp_path):
    eng = EngineProcess(tmp_path, "--decode-lanes", "2", "--kv-pool-tokens", "2048", "--grammar-vocab", "at-load")
    try:
        log = eng.log_text()
        assert "grammar vocabulary built in" in log, log  # before READY, which EngineProcess waited for
        enum = '{"grammars": [{"json_schema": {"enum": ["yes", "no"]}}]}'
        out = eng.run("first", list(range(10, 20)), max_tokens=20, grammar=enum)
        assert out.finished.finish_reason == "stop" and out.tokens[-1] in EOS_IDS
        assert eng.log_text().count("grammar vocabulary built in") == 1
    finally:
        assert eng.stop() == 0
