"""Decode graphs' static buffers: a padded bucket gives each sequence the logits and state a plain batch does.

On the CPU the graphs run as their eager twin (``capture=False``): the same
buffers, the same padding rows on the scratch lane and page, an eager forward
instead of a replay. Both families: the hq-e8-2b window and the MoE layer are
in the forward a graph captures.
"""

from __future__ import annotations

import pytest
import torch

from ignis.engine.decode_graphs import DecodeGraphs, buckets_up_to
from ignis.engine.forward_batch import ForwardBatch, SeqChunk
from ignis.engine.models.config import config_from_dict
from ignis.engine.models.hybrid import HybridModel
from ignis.engine.models.state import ModelState
from ignis.shared.demo.builder import model_config

VOCAB = 512
LANES = 5
PAGES = 24


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HybridModel(config_from_dict(model_config(VOCAB, eos_id=1, pad_id=0))).eval()


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(2, VOCAB, (n,), generator=g).tolist() for n in (5, 70, 1, 130, 64)]


def prefilled(model, scratch: bool, kv_format: str = "bf16") -> tuple[ModelState, list[list[int]]]:
    """A state with the prompts prefilled on lanes 0..4 (pages 4 apart); NaN in every unwritten page row."""
    state = ModelState.allocate(model.cfg, num_pages=PAGES, lanes=LANES, dtype=torch.float32,
                                fill=float("nan"), scratch=scratch, kv_format=kv_format,
                                exact_window=16 if kv_format == "hq-e8-2b" else 0)
    tables = [list(range(4 * i, 4 * i + 4)) for i in range(len(prompts()))]
    for lane, (ids, pages) in enumerate(zip(prompts(), tables)):
        state.reset_lane(lane)
        model(ForwardBatch.build([SeqChunk(ids, 0, pages, lane)]), state)
    return state, tables


def decode_chunks(tables, lanes, step: int) -> list[SeqChunk]:
    return [SeqChunk([7 + lane + step], len(prompts()[lane]) + step, tables[lane], lane) for lane in lanes]


def test_buckets_cover_every_size_up_to_the_largest():
    assert buckets_up_to(1) == [1]
    assert buckets_up_to(5) == [1, 2, 4, 5]
    assert buckets_up_to(32) == [1, 2, 4, 8, 16, 24, 32]
    sizes = buckets_up_to(20)
    assert all(any(b >= n for b in sizes) for n in range(1, 21)) and sizes[-1] == 20


def test_scratch_lane_and_page_are_beyond_what_the_scheduler_sees(model):
    state = ModelState.allocate(model.cfg, num_pages=PAGES, lanes=LANES, dtype=torch.float32, scratch=True)
    assert (state.lanes, state.num_pages) == (LANES, PAGES)
    assert (state.scratch_lane, state.scratch_page) == (LANES, PAGES)
    assert state.ssm.shape[1] == LANES + 1 and state.pages.shape[2] == PAGES + 1
    with pytest.raises(ValueError):
        _ = ModelState.allocate(model.cfg, num_pages=PAGES, lanes=LANES, dtype=torch.float32).scratch_lane


@pytest.mark.parametrize("kv_format", ["bf16", "hq-e8-2b"])
@pytest.mark.parametrize("lanes", [[0], [2, 0, 3], [4, 1, 0, 3, 2]])
def test_a_padded_bucket_decodes_like_a_plain_batch(model, lanes, kv_format):
    plain, tables = prefilled(model, scratch=False, kv_format=kv_format)
    padded, _ = prefilled(model, scratch=True, kv_format=kv_format)
    graphs = DecodeGraphs(model, padded, torch.device("cpu"), max_bs=8, max_len=PAGES * 64, capture=False)
    assert graphs.bucket_for(len(lanes)) > len(lanes) or len(lanes) in (1, 4)
    for step in range(3):  # three rounds: the buffers are refilled each time, stale rows never read
        chunks = decode_chunks(tables, lanes, step)
        assert graphs.takes(chunks)
        want = model(ForwardBatch.build(chunks), plain)
        got = graphs.run(chunks)
        assert got.shape == want.shape
        # a padded bucket runs the GEMMs over more rows than the plain batch, and the BLAS rounds by row
        # count (the projections' outputs part by ~5e-7): logits agree to ~1e-5, a wrong lane or a stale
        # row would be off by whole units
        torch.testing.assert_close(got, want, rtol=1e-5, atol=5e-5)
    for lane in range(LANES):  # every lane's state as the plain batches left it, the padding wrote only scratch
        torch.testing.assert_close(padded.ssm[:, lane], plain.ssm[:, lane], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(padded.conv[:, lane], plain.conv[:, lane], rtol=1e-5, atol=1e-6)
    live = padded.pages[:, :, :PAGES]
    assert torch.equal(live.isnan(), plain.pages.isnan()), "padding rows wrote into a live page"


def test_rounds_the_graphs_do_not_take(model):
    state, tables = prefilled(model, scratch=True)
    graphs = DecodeGraphs(model, state, torch.device("cpu"), max_bs=2, max_len=PAGES * 64, capture=False)
    assert not graphs.takes(decode_chunks(tables, [0, 1, 2], 0)), "more sequences than the largest bucket"
    assert not graphs.takes([SeqChunk([1, 2], 5, tables[0], 0)]), "a prefill chunk"
    assert not graphs.takes([])
    narrow = DecodeGraphs(model, state, torch.device("cpu"), max_bs=2, max_len=64, capture=False)
    assert not narrow.takes(decode_chunks(tables, [1], 0)), "a page table wider than the captured one"
    capturing = DecodeGraphs(model, state, torch.device("cpu"), max_bs=2, max_len=PAGES * 64)
    assert not capturing.capture() and "CUDA" in capturing.status
    assert not capturing.takes(decode_chunks(tables, [0], 0)), "nothing captured: every round eager"


def test_page_tables_follow_their_lanes_across_rounds(model):
    """The graphs keep page tables by lane and copy only what changed: a lane whose sequence grows a page,
    and a lane taken over by another sequence's pages, read what a plain batch reads."""
    plain, tables = prefilled(model, scratch=False)
    padded, _ = prefilled(model, scratch=True)
    graphs = DecodeGraphs(model, padded, torch.device("cpu"), max_bs=4, max_len=PAGES * 64, capture=False)
    # lane 4's prompt fills its first page: position 63 again (both states write the same), then 64 on a
    # second page, then lane 4 holds sequence 3's pages (both states read the same lane state either way)
    rounds = [[SeqChunk([9], 63, tables[4][:1], 4), SeqChunk([8], len(prompts()[1]), tables[1], 1)],
              [SeqChunk([7], 64, tables[4][:2], 4), SeqChunk([6], len(prompts()[1]) + 1, tables[1], 1)],
              [SeqChunk([5], len(prompts()[3]), tables[3], 4)],
              [SeqChunk([4], len(prompts()[3]) + 1, tables[3], 4), SeqChunk([3], 65, tables[4][:2], 1)]]
    for chunks in rounds:
        want = model(ForwardBatch.build(chunks), plain)
        torch.testing.assert_close(graphs.run(chunks), want, rtol=1e-5, atol=1e-5)
    assert graphs.lane_table[4, :4].tolist() == tables[3] and graphs.lane_table[1, :2].tolist() == tables[4][:2]


def test_graphs_stop_where_the_experts_would_wait_on_the_host(model, monkeypatch, caplog):
    """Where the grouped GEMM does not run (a GPU other than sm90, or not bf16), Qwen3-Next's experts read a
    group size on the host above DECODE_PAIRS pairs: the graphs are captured only up to the batch below that
    (the rounds above it eager, said in the log) instead of every graph failing at the first such bucket."""
    from ignis.engine.decode_graphs import capturable_batch
    from ignis.engine.models import moe
    from tests.engine.checkpoints import TINY_MOE, TINY_TEXT, layer_types

    text = dict(TINY_TEXT, **TINY_MOE, model_type="qwen3_next", layer_types=layer_types("interval4", 4))
    torch.manual_seed(0)
    next_model = HybridModel(config_from_dict(text)).eval()
    cuda = torch.device("cuda")  # fp32 on CUDA never takes the grouped GEMM: no device is touched
    limit = moe.DECODE_PAIRS // TINY_MOE["num_experts_per_tok"]
    assert next_model.sync_free_tokens(torch.float32, cuda) == limit
    with caplog.at_level("WARNING", logger="ignis.engine"):
        assert capturable_batch(next_model, torch.float32, cuda, 64) == limit
    assert f"up to {limit} sequences, not 64" in caplog.text
    assert capturable_batch(next_model, torch.float32, cuda, 8) == 8
    assert model.sync_free_tokens(torch.float32, cuda) is None, "a dense model never waits on the host"
    assert capturable_batch(model, torch.float32, cuda, 64) == 64

    # the limit is where the layer's form changes: at it nothing is read on the host, one more token reads it
    monkeypatch.setattr(moe, "grouped_mm_ok", lambda x, inter: False)
    layer = next(m for m in next_model.modules() if isinstance(m, moe.SparseMoE))
    reads = []
    real_item = torch.Tensor.__int__
    monkeypatch.setattr(torch.Tensor, "__int__", lambda t: reads.append(1) or real_item(t))
    with torch.no_grad():
        layer(torch.randn(limit, TINY_TEXT["hidden_size"]))
        assert not reads
        layer(torch.randn(limit + 1, TINY_TEXT["hidden_size"]))
    assert reads, "the padded form reads its group size on the host"
