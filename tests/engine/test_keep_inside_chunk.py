"""State images kept part way through a prefill chunk (one traversal for a marked prompt).

A chunk that crosses capture marks enters the forward as one sequence per
piece; the linear-attention layers run the pieces in waves and keep each
lane's state at the marks. The kept image must be the state a forward that
stops at the mark leaves (fp32, 1e-5 relative), the logits must be those of
the batch without keeps, and a marked prompt must take one round to prefill.
"""

from __future__ import annotations

import pytest
import torch

from ignis.engine.forward_batch import ForwardBatch, SeqChunk
from ignis.engine.models.build import load_model
from ignis.engine.models.state import ModelState
from ignis.engine.request import Request, capture_cuts
from ignis.engine.scheduler import Scheduler, SchedulerConfig
from ignis.shared.demo import ensure_demo_model
from ignis.shared.sampling import SamplingParams
from tests.engine.test_reuse import TOL, Engine, prompt, rel

PAGES = 48


@pytest.fixture(scope="module")
def model():
    m, _ = load_model(ensure_demo_model())
    return m


def pages(lane: int, n: int) -> list[int]:
    """Lane ``lane``'s own page table for ``n`` tokens (12 pages a lane)."""
    return list(range(12 * lane, 12 * lane + (n + 63) // 64))


def test_a_keeping_chunk_enters_as_pieces_advanced_in_waves():
    chunks = [SeqChunk([1], 9, [0], 0),  # a decode
              SeqChunk(list(range(10)), 0, [1], 1, keeps=((3, 5), (7, 6))),
              SeqChunk(list(range(4)), 0, [2], 2, sampled=False),
              SeqChunk(list(range(6)), 2, [3], 3, keeps=((4, 7),))]
    b = ForwardBatch.build(chunks)
    assert b.num_decodes == 1
    assert b.cu_seqlens.tolist() == [0, 1, 4, 8, 11, 15, 17, 21]
    assert b.seq_lens.tolist() == [10, 3, 7, 10, 4, 4, 8]
    assert b.slots.tolist() == [0, 1, 1, 1, 2, 3, 3]
    assert b.page_table[:, 0].tolist() == [0, 1, 1, 1, 2, 3, 3]
    assert b.logits_indices.tolist() == [0, 10, 20]  # the decode, each sampled chunk's last token
    w0, w1, w2 = b.linear_waves
    # rows relative to the first prefill token: a [0,10) as 0-3 | 3-7 | 7-10, c [10,14), d [14,20) as 14-16 | 16-20
    assert w0.rows.tolist() == [0, 1, 2, *range(10, 16)]
    assert (w0.cu_seqlens.tolist(), w0.slots.tolist(), w0.keeps) == ([0, 3, 7, 9], [1, 2, 3], ((1, 5), (3, 7)))
    assert w1.rows.tolist() == [3, 4, 5, 6, 16, 17, 18, 19]
    assert (w1.cu_seqlens.tolist(), w1.slots.tolist(), w1.keeps) == ([0, 4, 8], [1, 3], ((1, 6),))
    assert (w2.rows, w2.cu_seqlens.tolist(), w2.slots.tolist(), w2.keeps) == (slice(7, 10), [0, 3], [1], ())
    assert ForwardBatch.build(chunks[2:3]).linear_waves is None


@pytest.mark.parametrize("keeps", [((0, 1),), ((10, 1),), ((5, 1), (3, 2)), ((4, 1), (4, 2))])
def test_keeps_outside_the_chunk_or_out_of_order_are_refused(keeps):
    with pytest.raises(ValueError, match="keeps"):
        ForwardBatch.build([SeqChunk(list(range(10)), 0, [0], 0, keeps=keeps)])


def test_images_kept_part_way_equal_the_state_of_a_forward_that_stops_there(model):
    """A decode, two keeping chunks (one of them continuing a lane) and a plain one, in one forward:
    each kept image is the lane's state after the mark, on its own lane, whatever else the batch held."""
    cfg = model.cfg
    p0, p1, p2, head = prompt(300, 1), prompt(150, 2), prompt(90, 3), prompt(70, 4)
    state = ModelState.allocate(cfg, PAGES, 4, torch.float32, fill=float("nan"))
    state.allocate_slots(1, 3)  # slot 0 on the device, 1..3 on the host
    model(ForwardBatch.build([SeqChunk(head, 0, pages(3, 71), 3)]), state)  # lane 3 holds 70 tokens
    ref = ModelState.allocate(cfg, PAGES, 4, torch.float32, fill=float("nan"))
    model(ForwardBatch.build([SeqChunk(head, 0, pages(3, 71), 3)]), ref)

    keep = [SeqChunk(p0, 0, pages(0, 300), 0, keeps=((64, 0), (297, 2))),
            SeqChunk(p1, 0, pages(1, 150), 1),
            SeqChunk(p2, 70, pages(3, 160), 3, keeps=((120, 3),))]
    plain = [SeqChunk(p0, 0, pages(0, 300), 0), SeqChunk(p1, 0, pages(1, 150), 1),
             SeqChunk(p2, 70, pages(3, 160), 3)]
    got = model(ForwardBatch.build(keep), state)
    want = model(ForwardBatch.build(plain), ref)
    for g, w in zip(got, want):
        assert rel(g, w) < TOL

    for slot, lane, tokens, start, ahead in ((0, 0, p0[:64], 0, None), (2, 0, p0[:297], 0, None),
                                             (3, 3, p2[:50], 70, head)):
        stop = ModelState.allocate(cfg, PAGES, 4, torch.float32, fill=float("nan"))
        if ahead is not None:
            model(ForwardBatch.build([SeqChunk(ahead, 0, pages(lane, start + 1), lane)]), stop)
        model(ForwardBatch.build([SeqChunk(tokens, start, pages(lane, start + len(tokens)), lane)]), stop)
        block, i = (0, slot) if slot == 0 else (1, slot - 1)
        for live, kept in ((stop.ssm, state.slot_ssm[block]), (stop.conv, state.slot_conv[block])):
            err = float((kept[:, i] - live[:, lane]).abs().max() / live[:, lane].abs().max())
            assert err < TOL, (slot, err)
    untouched = state.slot_ssm[1][:, 0]  # host slot 1 was never named
    assert float(untouched.abs().max()) == 0.0


def test_an_hq_pool_refuses_to_keep_part_way():
    cfg = load_model(ensure_demo_model())[0].cfg
    state = ModelState.allocate(cfg, 8, 2, torch.float32, kv_format="hq-e8-2b", exact_window=16)
    state.allocate_slots(0, 2)
    with pytest.raises(ValueError, match="hq-e8-2b"):
        state.keep_part(0, "ssm", 0, 1)


def plan_of(inside: bool, prompt_len: int = 1024):
    sched = Scheduler(SchedulerConfig(decode_lanes=2, num_pages=64, max_model_len=4096,
                                      max_prefill_tokens_per_round=4096, capture_inside_chunks=inside),
                      host_slots=4)
    req = Request("a", tuple(range(1, prompt_len + 1)), SamplingParams(max_tokens=2), system_end=512,
                  opener_start=prompt_len - 3, must_cut_at=capture_cuts(prompt_len, 512, prompt_len - 3, 64))
    assert sched.add(req) is None
    return sched.schedule()


def test_a_chunk_crosses_the_marks_and_its_captures_are_kept_in_the_forward():
    plan = plan_of(inside=True)
    (chunk,) = plan.prefills
    assert (chunk.start, chunk.end, chunk.is_last) == (0, 1024, True)
    slots = [o.slot for o in plan.captures]
    assert chunk.keeps == ((512, slots[0]), (1021, slots[1]))
    assert all(o.kept_in_forward for o in plan.captures)


def test_without_inside_captures_a_chunk_ends_on_the_first_mark():
    plan = plan_of(inside=False)
    (chunk,) = plan.prefills
    assert (chunk.start, chunk.end, chunk.keeps) == (0, 512, ())
    (order,) = plan.captures
    assert not order.kept_in_forward


def test_a_marked_prompt_prefills_in_one_round_and_resumes_as_cold(model):
    p = prompt(1024, 9)
    eng = Engine(model)
    rounds = []
    run = eng.runner.run

    def counting(plan):
        if plan.prefills:
            rounds.append([(c.start, c.end) for c in plan.prefills])
        return run(plan)

    eng.runner.run = counting
    eng.submit("a", p, system_end=512, opener_start=1021)
    eng.run()
    assert rounds == [[(0, 1024)]]
    assert sorted(e.kind for e in eng.sched.store.entries()) == ["prompt_checkpoint", "retained_prefix"]
    sibling = p[:512] + prompt(100, 10)
    eng.submit("retry", p, system_end=512, opener_start=1021)
    eng.submit("sibling", sibling, system_end=512, opener_start=609)
    eng.run()
    assert (eng.finished["retry"].cached_tokens, eng.finished["sibling"].cached_tokens) == (1021, 512)
    for rid, tokens in (("retry", p), ("sibling", sibling)):
        cold = Engine(model, reuse=False)
        cold.submit("cold", tokens)
        cold.run()
        assert rel(eng.first_logits[rid], cold.first_logits["cold"]) < TOL
        assert eng.tokens[rid] == cold.tokens["cold"]
    eng.check_drained()
