"""TokenStreams: one request's bad output ends that request with an error; the others' tokens go out."""

from __future__ import annotations

import math

from ignis.engine.metrics import EngineMetrics
from ignis.engine.sampling import TokenLogprobs
from ignis.engine.schedule import RoundResult
from ignis.engine.token_streams import TokenStreams, Tracked
from ignis.shared.wire import TokenBatch


class Channel:
    def __init__(self):
        self.sent = []

    def send(self, msg, peer):
        self.sent.append((peer, msg))


class Scheduler:
    def __init__(self):
        self.aborted = {}

    def get(self, rid):
        return None

    def abort(self, rid, reason="abort", message=""):
        self.aborted[rid] = (reason, message)


def test_a_non_finite_logprob_ends_only_its_request():
    chan, sched = Channel(), Scheduler()
    streams = TokenStreams(chan, EngineMetrics("m"))
    for rid in ("good", "bad", "plain"):
        streams.tracked[rid] = Tracked(peer=b"gw", request_class="interactive", prompt_tokens=4, arrived=0.0)
    result = RoundResult(tokens={"good": 5, "bad": 6, "plain": 7})
    logprobs = {"good": TokenLogprobs(-0.5, [(5, -0.5), (9, -1.5)]),
                "bad": TokenLogprobs(math.nan, [(6, math.nan)])}
    streams.send_tokens(result, logprobs, sched)
    assert sched.aborted == {"bad": ("error", sched.aborted["bad"][1])}
    assert "non-finite logprob" in sched.aborted["bad"][1]
    [(peer, batch)] = chan.sent
    assert peer == b"gw" and isinstance(batch, TokenBatch)
    assert [(s.id, s.token_ids) for s in batch.streams] == [("good", (5,)), ("plain", (7,))]
    assert batch.streams[0].logprobs.logprobs == (-0.5,)
