"""TokenStreams: one request's bad output ends that request with an error; the others' tokens go out."""

from __future__ import annotations

import json

import math
import time

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


def test_speculative_steps_stream_their_tokens_and_count_drafts(caplog):
    from ignis.engine.schedule import FinishEvent

    chan, sched = Channel(), Scheduler()
    metrics = EngineMetrics("m")
    streams = TokenStreams(chan, metrics)
    now = time.monotonic()
    streams.tracked["a"] = Tracked(peer=b"gw", request_class="interactive", prompt_tokens=4, arrived=now,
                                   admitted=now)
    streams.send_tokens(RoundResult(tokens={"a": 5}, extra={"a": [6, 7]}, drafted={"a": 3}), {}, sched)
    streams.send_tokens(RoundResult(tokens={"a": 8}, extra={"a": []}, drafted={"a": 2}), {}, sched)
    assert [s.token_ids for _, b in chan.sent for s in b.streams] == [(5, 6, 7), (8,)]
    value = metrics.registry.get_sample_value
    assert value("ignis:spec_decode_num_drafts_total", {"model_name": "m"}) == 2
    assert value("ignis:spec_decode_num_draft_tokens_total", {"model_name": "m"}) == 5
    assert value("ignis:spec_decode_num_accepted_tokens_total", {"model_name": "m"}) == 2
    assert value("ignis:spec_decode_num_accepted_tokens_per_pos_total", {"model_name": "m", "position": "1"}) == 1
    with caplog.at_level("INFO", logger="ignis.engine"):
        streams.finish(FinishEvent("a", "length", 4, 4), "m")
    assert '"spec":{"drafted":5,"accepted":2,"accept_rate_per_pos":[0.5,0.5,0.0]}' in caplog.text


def test_a_speculative_round_cut_at_its_requests_end_sends_the_logprobs_of_the_tokens_kept():
    """The runner gives one logprob per token it accepted; the scheduler then cuts the round where the
    request ended (a stop id, max_tokens): the stream carries the kept tokens and their logprobs only."""
    chan, sched = Channel(), Scheduler()
    streams = TokenStreams(chan, EngineMetrics("m"))
    streams.tracked["a"] = Tracked(peer=b"gw", request_class="interactive", prompt_tokens=4, arrived=0.0)
    lps = [TokenLogprobs(-0.1 * (i + 1), [(t, -0.1 * (i + 1))]) for i, t in enumerate((5, 6, 7))]
    streams.send_tokens(RoundResult(tokens={"a": 5}, extra={"a": [6]}, drafted={"a": 2}), {"a": lps}, sched)
    assert sched.aborted == {}
    [(_, batch)] = chan.sent
    [stream] = batch.streams
    assert stream.token_ids == (5, 6)
    assert stream.logprobs.logprobs == (-0.1, -0.2) and stream.logprobs.top_ids == ((5,), (6,))


def test_prompt_scores_go_out_before_the_tokens_and_the_done_line_counts_them(caplog):
    from ignis.engine.schedule import FinishEvent
    from ignis.shared.wire import PromptLogprobs
    from ignis.shared.wire import TokenLogprobs as WireLogprobs

    chan, sched = Channel(), Scheduler()
    streams = TokenStreams(chan, EngineMetrics("m"))
    now = time.monotonic()
    streams.tracked["a"] = Tracked(peer=b"gw", request_class="interactive", prompt_tokens=4, arrived=now,
                                   admitted=now)
    scores = [PromptLogprobs("a", 1, (1, 2), WireLogprobs((-0.1, -0.2), ((), ()), ((), ()))),
              PromptLogprobs("a", 3, (1,), WireLogprobs((-0.3,), ((),), ((),)))]
    streams.send_tokens(RoundResult(tokens={"a": 5}, prompt_logprobs={"a": scores}), {}, sched)
    assert [type(m).__name__ for _, m in chan.sent] == ["PromptLogprobs", "PromptLogprobs", "TokenBatch"]
    with caplog.at_level("INFO", logger="ignis.engine"):
        streams.finish(FinishEvent("a", "length", 4, 1), "m")
    assert '"prompt_logprobs":{"scored":3}' in caplog.text


def test_a_salted_adapter_request_says_so_in_its_done_line_and_counts_for_its_adapter(caplog):
    from ignis.engine.schedule import FinishEvent
    from ignis.shared.sampling import SamplingParams
    from ignis.shared.wire import Generate

    metrics = EngineMetrics("m")
    streams = TokenStreams(Channel(), metrics)
    streams.track(b"gw", Generate("a", (1, 2, 3), SamplingParams(), cache_salt="5" * 64, adapter="tuned"))
    streams.track(b"gw", Generate("b", (1, 2, 3), SamplingParams()))
    with caplog.at_level("INFO", logger="ignis.engine"):
        streams.finish(FinishEvent("a", "length", 3, 1), "m")
        streams.finish(FinishEvent("b", "length", 3, 1), "m")
    a_line, b_line = [r.getMessage() for r in caplog.records if '"event":"done"' in r.getMessage()]
    assert '"cache_salt":true' in a_line and '"adapter":"tuned"' in a_line
    assert "cache_salt" not in b_line and "adapter" not in b_line
    text = metrics.render().decode()
    assert 'ignis:lora_requests_total{adapter="tuned",model_name="m"} 1.0' in text


def test_done_lines_go_to_debug_with_log_requests_off(caplog):
    from ignis.engine.schedule import FinishEvent
    from ignis.shared.sampling import SamplingParams
    from ignis.shared.wire import Generate

    metrics = EngineMetrics("m")
    streams = TokenStreams(Channel(), metrics, done_lines=False)
    for rid in ("a", "b"):
        streams.track(b"gw", Generate(rid, (1, 2, 3), SamplingParams()))
    with caplog.at_level("INFO", logger="ignis.engine"):
        streams.finish(FinishEvent("a", "length", 3, 1), "m")
    assert not [r for r in caplog.records if '"event":"done"' in r.getMessage()]
    with caplog.at_level("DEBUG", logger="ignis.engine"):
        streams.finish(FinishEvent("b", "length", 3, 1), "m")
    assert [r.levelname for r in caplog.records if '"event":"done"' in r.getMessage()] == ["DEBUG"]
    assert 'ignis:request_success_total{finished_reason="length",model_name="m"} 2.0' in metrics.render().decode()


def test_a_first_admission_tells_the_gateway_the_cached_prompt_once():
    from types import SimpleNamespace

    from ignis.shared.wire import Admitted

    class Admitting(Scheduler):
        def get(self, rid):
            return SimpleNamespace(cached_tokens={"warm": 128, "cold": 0}[rid])

    chan, sched = Channel(), Admitting()
    streams = TokenStreams(chan, EngineMetrics("m"))
    for rid in ("warm", "cold"):
        streams.tracked[rid] = Tracked(peer=b"gw-" + rid.encode(), request_class="agent", prompt_tokens=200,
                                       arrived=0.0)
    lanes = [SimpleNamespace(req_id="warm"), SimpleNamespace(req_id="cold")]
    streams.admitted(lanes, 1.0, sched)
    assert chan.sent == [(b"gw-warm", Admitted("warm", 128)), (b"gw-cold", Admitted("cold", 0))]
    streams.admitted(lanes[:1], 2.0, sched)  # resumed after a preemption: its first admission stands
    assert len(chan.sent) == 2 and streams.tracked["warm"].admitted == 1.0


def test_a_request_ended_before_its_first_token_has_no_ttft_in_its_done_line(caplog):
    """Aborted in its queue: neither prefill nor first token (null, not the time it waited); aborted while
    prefilling: the prefill it did, and no first token."""
    import json

    from ignis.engine.schedule import FinishEvent
    from ignis.shared.sampling import SamplingParams
    from ignis.shared.wire import Generate

    streams = TokenStreams(Channel(), EngineMetrics("m"))
    for rid in ("queued", "prefilling"):
        streams.track(b"gw", Generate(rid, (1, 2, 3), SamplingParams()))
    streams.tracked["prefilling"].admitted = time.monotonic()
    with caplog.at_level("INFO", logger="ignis.engine"):
        streams.finish(FinishEvent("queued", "abort", 3, 0), "m")
        streams.finish(FinishEvent("prefilling", "abort", 3, 0), "m")
    queued, prefilling = [json.loads(r.getMessage()) for r in caplog.records
                          if '"event":"done"' in r.getMessage()]
    assert queued["ttft_ms"] is None and queued["prefill_ms"] is None and queued["queue_ms"] >= 0
    assert prefilling["ttft_ms"] is None and prefilling["prefill_ms"] >= 0


def test_the_gateways_notes_and_a_tier_wait_are_in_the_done_line_and_the_wait_is_timed(caplog):
    from ignis.engine.schedule import FinishEvent
    from ignis.shared.sampling import SamplingParams
    from ignis.shared.wire import Generate

    metrics = EngineMetrics("m")
    streams = TokenStreams(Channel(), metrics)
    streams.track(b"gw", Generate("a", (1, 2, 3), SamplingParams(), notes="tool 'web_search' left out"))
    streams.track(b"gw", Generate("b", (1, 2, 3), SamplingParams()))
    with caplog.at_level("INFO", logger="ignis.engine"):
        streams.finish(FinishEvent("a", "length", 3, 1, tier_wait_s=0.25), "m")
        streams.finish(FinishEvent("b", "length", 3, 1), "m")
    a_line, b_line = [r.getMessage() for r in caplog.records if '"event":"done"' in r.getMessage()]
    assert '"notes":"tool \'web_search\' left out"' in a_line and '"tier_wait_ms":250.0' in a_line
    assert "notes" not in b_line and "tier_wait_ms" not in b_line
    value = metrics.registry.get_sample_value
    assert value("ignis:reuse_tier_wait_seconds_count", {"model_name": "m"}) == 1
    assert value("ignis:reuse_tier_wait_seconds_sum", {"model_name": "m"}) == 0.25


def test_a_request_that_ended_while_evicted_says_so_in_its_done_line(caplog):
    from ignis.engine.schedule import FinishEvent
    from ignis.shared.sampling import SamplingParams
    from ignis.shared.wire import Generate

    streams = TokenStreams(Channel(), EngineMetrics("m"))
    for rid in "abc":
        streams.track(b"gw", Generate(rid, (1, 2, 3), SamplingParams()))
    with caplog.at_level("INFO", logger="ignis.engine"):
        streams.finish(FinishEvent("a", "abort", 3, 1, live_evictions=1), "m")  # its client left while evicted
        streams.finish(FinishEvent("b", "length", 3, 1, live_evictions=2, live_resumes=2, recomputed=1), "m")
        streams.finish(FinishEvent("c", "length", 3, 1), "m")
    lines = [json.loads(r.getMessage()[r.getMessage().index("{"):]) for r in caplog.records
             if '"event":"done"' in r.getMessage()]
    assert [line.get("preempted") for line in lines] == [
        {"evicted_live": 1, "resumed_live": 0, "recomputed": 0},
        {"evicted_live": 2, "resumed_live": 2, "recomputed": 1}, None]
    assert [line["model"] for line in lines] == ["m"] * 3  # the model that ran it


def test_a_request_that_never_drafts_is_noted_once_and_counted(caplog):
    from ignis.engine.schedule import FinishEvent
    from ignis.shared.sampling import SamplingParams
    from ignis.shared.wire import Generate

    metrics = EngineMetrics("m")
    streams = TokenStreams(Channel(), metrics)
    streams.track(b"gw", Generate("a", (1, 2, 3), SamplingParams()))
    streams.undrafted({"a": "adapter", "gone": "adapter"})
    streams.undrafted({"a": "adapter"})  # a resumed request starts again: counted once
    with caplog.at_level("INFO", logger="ignis.engine"):
        streams.finish(FinishEvent("a", "length", 3, 1), "m")
    assert '"spec":{"off":"adapter"}' in caplog.text
    value = metrics.registry.get_sample_value
    assert value("ignis:spec_decode_undrafted_requests_total", {"model_name": "m", "reason": "adapter"}) == 1
