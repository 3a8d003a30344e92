"""The memory plan's figures: embedding, LM head (tied or not), one round's logits, the sampler's scratch,
the chunked GDN prefill's scratch."""

from __future__ import annotations

import dataclasses

from ignis.engine.memory_plan import (
    device_budget,
    CPU_DEFAULT_KV_BYTES,
    embedding_bytes,
    gdn_scratch_bytes,
    kv_page_bytes,
    lane_bytes,
    lm_head_bytes,
    logits_bytes,
    plan_memory,
    sampler_workspace_bytes,
)
from ignis.engine.models.config import config_from_dict
from ignis.engine.sampling import SamplerWorkspace

QWEN35_27B = config_from_dict(dict(
    architectures=["Qwen3_5ForCausalLM"], num_hidden_layers=64, full_attention_interval=4, num_attention_heads=24,
    num_key_value_heads=4, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_conv_kernel_dim=4, hidden_size=5120, intermediate_size=17408,
    vocab_size=248320, dtype="bfloat16", tie_word_embeddings=False))
TIED_27B = dataclasses.replace(QWEN35_27B, tie_word_embeddings=True)


def test_embedding_and_lm_head_tied_or_not():
    assert embedding_bytes(QWEN35_27B, "bfloat16") == 248_320 * 5120 * 2 == 2_542_796_800
    assert lm_head_bytes(QWEN35_27B, "bfloat16") == 2_542_796_800
    assert lm_head_bytes(TIED_27B, "bfloat16") == 0
    assert embedding_bytes(TIED_27B, "float32") == 248_320 * 5120 * 4


def test_logits_of_a_round_are_the_head_output_and_its_fp32_copy():
    assert logits_bytes(QWEN35_27B, "bfloat16", 32) == 32 * 248_320 * (2 + 4) == 47_677_440
    assert logits_bytes(QWEN35_27B, "float32", 32) == 32 * 248_320 * 4  # the head's output is already fp32


def test_the_free_memory_budget_sets_one_rounds_logits_aside():
    page, image = kv_page_bytes(QWEN35_27B, "bfloat16"), lane_bytes(QWEN35_27B, "bfloat16")
    assert (page, image) == (4_194_304, 153_944_064)
    plan = plan_memory(QWEN35_27B, "bfloat16", 32, free_device_bytes=40 << 30, device_slots=2)
    # (40 GiB - 2 slots - 45.5 MiB of logits - 32 lanes) * 0.85 // page; without the logits it would be 7643
    assert int((42_949_672_960 - 2 * image - 47_677_440 - 32 * image) * 0.85) // page == 7633
    assert plan.pages == 7633
    assert (plan.embedding_bytes, plan.lm_head_bytes, plan.logits_bytes) == (2_542_796_800, 2_542_796_800, 47_677_440)
    text = plan.describe()
    assert "embedding 2542796800 bytes, LM head 2542796800 bytes" in text
    assert "logits 47677440 bytes (45.5 MiB) per round for 32 rows" in text
    assert "LM head tied to the embedding" in plan_memory(TIED_27B, "bfloat16", 32, kv_pool_tokens=64).describe()


def test_explicit_budgets_are_the_pools_alone():
    page = kv_page_bytes(QWEN35_27B, "bfloat16")
    assert plan_memory(QWEN35_27B, "bfloat16", 32, kv_pool_tokens=6400).pages == 100
    assert plan_memory(QWEN35_27B, "bfloat16", 32).pages == CPU_DEFAULT_KV_BYTES // page
    assert plan_memory(QWEN35_27B, "bfloat16", 32, kv_memory_bytes=10 * page).pages == 10


def test_the_sampler_workspace_figure_is_the_workspace():
    assert sampler_workspace_bytes(248_320) == 248_320 * 57 == 14_154_240
    assert SamplerWorkspace(248_320).nbytes == sampler_workspace_bytes(248_320)


def test_gdn_scratch_is_u_w_and_one_chunk_start_state_per_chunk():
    # one 8K sequence, bf16: u and w 384 MiB, 128 bf16 states of 48 x 128 x 128 192 MiB
    assert gdn_scratch_bytes(QWEN35_27B, "bfloat16", 8192, 1) == 4 * 8192 * 48 * 256 + 128 * 48 * 128 * 128 * 2
    assert gdn_scratch_bytes(QWEN35_27B, "bfloat16", 8192, 1) == 603_979_776
    assert gdn_scratch_bytes(QWEN35_27B, "float32", 8192, 1) == 805_306_368  # fp32 states
    # each of 32 sequences may leave under one chunk unused: 63 chunks bound 2,048 tokens, not 32
    assert gdn_scratch_bytes(QWEN35_27B, "bfloat16", 2048, 32) == 4 * 2048 * 48 * 256 + 63 * 48 * 128 * 128 * 2
    # a round has at most one sequence per token; none without a prefill budget
    assert gdn_scratch_bytes(QWEN35_27B, "bfloat16", 3, 32) == 4 * 3 * 48 * 256 + 3 * 48 * 128 * 128 * 2
    assert gdn_scratch_bytes(QWEN35_27B, "bfloat16", 0, 32) == 0


def test_the_free_memory_budget_sets_the_gdn_scratch_aside():
    page, image = kv_page_bytes(QWEN35_27B, "bfloat16"), lane_bytes(QWEN35_27B, "bfloat16")
    plan = plan_memory(QWEN35_27B, "bfloat16", 32, free_device_bytes=40 << 30, device_slots=2, prefill_tokens=2048)
    assert plan.gdn_scratch_bytes == 199_753_728
    # 7633 pages with the logits alone set aside (above)
    assert int((42_949_672_960 - 2 * image - 47_677_440 - 199_753_728 - 32 * image) * 0.85) // page == 7593
    assert plan.pages == 7593
    assert "GDN prefill scratch 199753728 bytes (190.5 MiB) for 2048 tokens per round" in plan.describe()
    # an explicit pool is the pool alone; the figure is still reported
    explicit = plan_memory(QWEN35_27B, "bfloat16", 32, kv_pool_tokens=6400, prefill_tokens=2048)
    assert (explicit.pages, explicit.gdn_scratch_bytes) == (100, 199_753_728)


def test_gpu_memory_utilization_leaves_its_share_of_the_device_free():
    gib = 1 << 30
    assert device_budget(80 * gib, 140 * gib, None, 0.85) == (80 * gib, 0.85)  # --kv-memory-fraction alone
    free, fraction = device_budget(80 * gib, 140 * gib, 0.9, 0.85)
    assert (free, fraction) == (80 * gib - 14 * gib, 1.0)  # 14 GiB of the 140 stay unused
    assert device_budget(10 * gib, 140 * gib, 0.9, 0.85) == (0, 1.0)  # weights past F: no room, the plan refuses


def test_lanes_that_leave_no_room_for_the_pool_are_named():
    import pytest

    image = lane_bytes(QWEN35_27B, "bfloat16")
    with pytest.raises(ValueError, match=r"256 decode lanes' live state takes .* lower --decode-lanes \(--max-num-seqs\)"):
        plan_memory(QWEN35_27B, "bfloat16", 256, free_device_bytes=200 * image)
    assert plan_memory(QWEN35_27B, "bfloat16", 16, free_device_bytes=200 * image).pages > 0


def test_speculating_sets_every_lanes_snapshot_aside():
    """A drafter keeps each lane's state (and the scratch lane's) from before the verify forward: on a
    free-memory budget that comes out of the pool, and the plan says so."""
    image = lane_bytes(QWEN35_27B, "bfloat16")
    plain = plan_memory(QWEN35_27B, "bfloat16", 16, free_device_bytes=40 << 30)
    spec = plan_memory(QWEN35_27B, "bfloat16", 16, free_device_bytes=40 << 30, speculating=True)
    assert spec.spec_snapshot_bytes == 17 * image and plain.spec_snapshot_bytes == 0
    assert (plain.pages - spec.pages) * spec.page_bytes >= int(17 * image * 0.85) - spec.page_bytes
    assert "speculative snapshot" in spec.describe() and "speculative snapshot" not in plain.describe()
    explicit = plan_memory(QWEN35_27B, "bfloat16", 16, kv_pool_tokens=6400, speculating=True)
    assert explicit.pages == 100  # an explicit pool is the pool alone
