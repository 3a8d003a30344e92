"""Cache resets (engine.cache_flushes, Scheduler.flush_retained): every retained entry dropped, only when idle.

The queue of asked resets with a stand-in scheduler (refused while requests
are in flight, waited while copies land, at most ``WAIT_S``), then the real
scheduler on the demo model: after a reset nothing is resumed and the output
is the cold one, learned points are gone too, and a reset with requests in
flight is refused and changes nothing.
"""

from __future__ import annotations

from ignis.engine.cache_flushes import WAIT_S, CacheFlushes
from ignis.shared.wire import CacheFlushed, FlushCache
from tests.engine.test_reuse import Engine, model, prompt  # noqa: F401 (model: a fixture)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class StandIn:
    """A scheduler whose blocker the test sets; counts the resets done."""

    def __init__(self):
        self.blocker = None
        self.flushed = 0

    def flush_blocker(self):
        return self.blocker

    def flush_retained(self):
        self.flushed += 1
        return 7, True


def _queue():
    sent = []
    clock = Clock()
    return CacheFlushes(lambda msg, peer: sent.append((peer, msg)), clock), sent, clock


def test_an_idle_engine_resets_at_once_and_answers_the_gateway_that_asked():
    flushes, sent, _ = _queue()
    sched = StandIn()
    flushes.ask(b"gw1", FlushCache("f1"))
    flushes.ask(b"gw2", FlushCache("f2"))
    flushes.service(sched, 0)
    assert sent == [(b"gw1", CacheFlushed("f1", True, 7)), (b"gw2", CacheFlushed("f2", True, 7))]
    assert sched.flushed == 2 and len(flushes) == 0


def test_requests_in_flight_refuse_a_reset_and_nothing_is_dropped():
    flushes, sent, _ = _queue()
    sched = StandIn()
    sched.blocker = ("2 requests are in flight", False)
    flushes.ask(b"gw", FlushCache("f"))
    flushes.service(sched, 0)
    assert sent == [(b"gw", CacheFlushed("f", False, 0, "2 requests are in flight"))] and sched.flushed == 0
    sched.blocker = None
    flushes.ask(b"gw", FlushCache("g"))
    flushes.service(sched, 3)  # waiting before the scheduler (a model load, a grammar compile)
    assert sent[-1] == (b"gw", CacheFlushed("g", False, 0, "3 requests are in flight")) and sched.flushed == 0


def test_copies_in_flight_are_waited_out_for_a_while():
    flushes, sent, clock = _queue()
    sched = StandIn()
    sched.blocker = ("copies to or from tierd are in flight", True)
    flushes.ask(b"gw", FlushCache("f"))
    flushes.service(sched, 0)
    assert sent == [] and len(flushes) == 1
    sched.blocker = None
    flushes.service(sched, 0)
    assert sent == [(b"gw", CacheFlushed("f", True, 7))]
    sched.blocker = ("copies to or from tierd are in flight", True)
    flushes.ask(b"gw", FlushCache("g"))
    clock.now += WAIT_S + 1
    flushes.service(sched, 0)
    assert sent[-1][1].flushed is False and "for 10 s" in sent[-1][1].message


def test_an_engine_with_no_model_loaded_holds_nothing_to_reset():
    flushes, sent, _ = _queue()
    flushes.ask(b"gw", FlushCache("f"))
    flushes.service(None, 0)
    assert sent == [(b"gw", CacheFlushed("f", True, 0))]
    flushes.ask(b"gw", FlushCache("g"))
    flushes.service(None, 1)  # a request waits for its model to load
    assert sent[-1] == (b"gw", CacheFlushed("g", False, 0, "1 request is in flight"))


SYSTEM = prompt(150, 41)


def test_a_reset_drops_every_retained_entry_and_the_next_request_is_cold(model):
    eng = Engine(model)
    t1 = SYSTEM + prompt(40, 42)
    eng.submit("a", t1 + [5, 6], system_end=150, opener_start=len(t1))
    eng.run()
    store = eng.sched.store
    assert len(store) == 2 and len(eng.sched.learned) == 1
    assert eng.sched.flush_blocker() is None
    dropped, told = eng.sched.flush_retained()
    assert (dropped, told) == (2, True)
    assert len(store) == 0 and len(eng.sched.learned) == 0 and store.stats()["reuse_flushes_total"] == 1
    assert eng.sched.pool.num_free == eng.sched.pool.num_pages and store.slots.num_free == store.slots.total
    eng.submit("again", t1 + [5, 6], system_end=150, opener_start=len(t1))
    eng.run()
    assert eng.finished["again"].cached_tokens == 0 and eng.tokens["again"] == eng.tokens["a"]
    eng.submit("third", t1 + [5, 6], system_end=150, opener_start=len(t1))
    eng.run()
    assert eng.finished["third"].cached_tokens == len(t1)  # reuse goes on after a reset
    eng.check_drained()


def test_a_reset_with_a_request_in_flight_is_refused_and_keeps_everything(model):
    eng = Engine(model)
    t1 = SYSTEM + prompt(40, 43)
    eng.submit("a", t1 + [5, 6], system_end=150, opener_start=len(t1))
    eng.run()
    eng.submit("b", prompt(30, 44), max_tokens=4)
    why, passes = eng.sched.flush_blocker()
    assert why == "1 request is in flight" and not passes
    eng.run()
    assert len(eng.sched.store) == 2
    eng.submit("c", t1 + [5, 6], system_end=150, opener_start=len(t1))
    eng.run()
    assert eng.finished["c"].cached_tokens == len(t1)
    eng.check_drained()
