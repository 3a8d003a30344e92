"""Images: the vision tower's encode time per picture, and the encoder cache in a conversation.

In one process, on the CPU or the GPU (``--device``), with random weights (no
checkpoint needed): a Qwen3.5-shaped vision tower (``--depth`` blocks of width
``--width``, patch 16, merge 2) encodes square pictures of three sizes
(already resized to the patch grid), timed after a warm-up; then a small
hybrid model with that tower holds a 10-turn conversation through the
scheduler and runner (no sockets, reuse off), each turn re-sending the whole
history: an image in turn 1, another in turn 5. The encoder cache's hit ratio
is hits over lookups: what a repeated image saves even when its prefix is not
resumed.

Then, with reuse on: the time to the first token of a conversation's second
turn whose history holds a 512x512 picture (256x256 in ``--quick``), resumed from the first turn's
checkpoint (warm: past the image, nothing encoded) against the same prompt on
a fresh engine (cold: the image encoded, the whole prompt prefilled). Last
line: ``BENCH images encode_ms_256=.. encode_ms_512=A encode_ms_768=..
cache_hit_ratio=.. warm_cold_image_turn=B``.

    python bench/images.py [--device cpu] [--depth 8] [--width 512] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time

from checkout import use_checkout  # noqa: E402

use_checkout()

import torch  # noqa: E402

SIZES = (256, 512, 768)


def vision_config(depth: int, width: int, out_hidden: int):
    from ignis.engine.models.vision_config import vision_config_from_dict

    raw = {"vision_config": {"depth": depth, "hidden_size": width, "intermediate_size": 4 * width,
                             "num_heads": max(1, width // 64), "out_hidden_size": out_hidden, "patch_size": 16,
                             "num_position_embeddings": 2304},
           "image_token_id": 250, "video_token_id": 251, "vision_start_token_id": 252, "vision_end_token_id": 253}
    text = {"rope_parameters": {"rope_type": "default", "mrope_section": [11, 11, 10]}}
    return vision_config_from_dict(raw, text, {"image_mean": [0.5] * 3, "image_std": [0.5] * 3})


def random_tower(vcfg, device: str):
    from ignis.engine.models.vision import VisionTower

    torch.manual_seed(0)
    tower = VisionTower(vcfg)
    for p in tower.parameters():
        torch.nn.init.normal_(p, std=0.02)
    return tower.to(device).eval()


def picture(side: int, seed: int):
    from ignis.shared.image_input import ImageInput

    g = torch.Generator().manual_seed(seed)
    return ImageInput.from_rgb(torch.randint(0, 256, (side * side * 3,), dtype=torch.uint8, generator=g)
                               .numpy().tobytes(), side, side)


def encode_ms(tower, side: int, repeats: int) -> float:
    """Milliseconds to patchify and encode one ``side x side`` picture (median of ``repeats``)."""
    from ignis.engine.models.image_patches import patchify

    image = picture(side, side)
    device = tower.patch_embed.proj.weight.device
    times = []
    for i in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        patches, grid = patchify(image, tower.cfg)
        tower([patches], [grid])
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:  # the first run warms up
            times.append((time.perf_counter() - t0) * 1000)
    return sorted(times)[len(times) // 2]


def small_model(vcfg, device: str):
    """A small random hybrid model (4 layers) with the random tower ``vcfg`` attached."""
    from ignis.engine.models.config import config_from_dict
    from ignis.engine.models.hybrid import HybridModel

    cfg = config_from_dict({"architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": {
        "vocab_size": 256, "hidden_size": vcfg.out_hidden_size, "intermediate_size": 2 * vcfg.out_hidden_size,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
        "linear_value_head_dim": 32, "max_position_embeddings": 65536}})
    torch.manual_seed(1)
    model = HybridModel(cfg)
    for name, p in model.named_parameters():
        if not name.endswith(("A_log", "dt_bias")) and "norm" not in name:
            torch.nn.init.normal_(p, std=0.02)
    model = model.to(device).eval()
    model.attach_vision(random_tower(vcfg, device))
    return cfg, model


def image_span(vcfg, image) -> list[int]:
    """The placeholder tokens of one resized picture: start, one pad per merged patch, end."""
    factor = vcfg.patch_size * vcfg.spatial_merge_size
    n = (image.height // factor) * (image.width // factor)
    return [vcfg.vision_start_token_id] + [vcfg.image_token_id] * n + [vcfg.vision_end_token_id]


def conversation_hit_ratio(vcfg, device: str, turns: int = 10) -> tuple[float, int]:
    """(encoder-cache hit ratio, images encoded) over a ``turns``-turn conversation re-sending its history."""
    from ignis.engine.models.state import ModelState
    from ignis.engine.request import Request
    from ignis.engine.runner import ModelRunner
    from ignis.engine.scheduler import Scheduler, SchedulerConfig
    from ignis.shared.sampling import SamplingParams

    cfg, model = small_model(vcfg, device)
    factor = vcfg.patch_size * vcfg.spatial_merge_size
    pages, lanes = 256, 2
    sched = Scheduler(SchedulerConfig(decode_lanes=lanes, num_pages=pages, max_model_len=pages * 64,
                                      image_token_id=vcfg.image_token_id, image_factor=factor),
                      host_slots=0, reuse=False)
    state = ModelState.allocate(cfg, num_pages=pages, lanes=lanes, dtype=torch.float32, device=device)
    runner = ModelRunner(model, state, device=device, vocab_limit=240)
    g = torch.Generator().manual_seed(2)
    history, images = [], []
    for turn in range(turns):
        history += torch.randint(0, 240, (20,), generator=g).tolist()
        if turn in (0, 4):
            image = picture(256 if turn == 0 else 192, 100 + turn)
            images.append(image)
            history += image_span(vcfg, image)
        assert sched.add(Request(f"t{turn}", tuple(history), SamplingParams(temperature=0.0, max_tokens=4,
                                                                             ignore_eos=True),
                                 images=tuple(images))) is None
        out = []
        while sched.has_work:
            plan = sched.schedule()
            if plan.is_empty:
                continue
            result, _ = runner.run(plan)
            out += list(result.tokens.values())
            for ev in sched.update(result):
                runner.release(ev.req_id)
        history += out
    cache = runner.images.cache
    state.close()
    return cache.hit_ratio, runner.images.encoded


def image_turn_ttft(vcfg, device: str, side: int) -> tuple[float, float]:
    """(warm, cold) seconds to the first token of a conversation's second turn, whose history holds a
    ``side``-pixel picture: warm resumes from the first turn's checkpoint (past the image: nothing to
    encode), cold is the same prompt on a fresh engine (the image encoded, everything prefilled)."""
    from ignis.engine.models.state import ModelState
    from ignis.engine.request import Request, capture_cuts
    from ignis.engine.runner import ModelRunner
    from ignis.engine.scheduler import Scheduler, SchedulerConfig
    from ignis.shared.sampling import SamplingParams

    cfg, model = small_model(vcfg, device)
    factor = vcfg.patch_size * vcfg.spatial_merge_size
    pages, lanes = 256, 2
    g = torch.Generator().manual_seed(3)
    image = picture(side, 7)
    opener = [5, 6, 7]

    def engine():
        sched = Scheduler(SchedulerConfig(decode_lanes=lanes, num_pages=pages, max_model_len=pages * 64,
                                          image_token_id=vcfg.image_token_id, image_factor=factor),
                          host_slots=4, reuse=True)
        state = ModelState.allocate(cfg, num_pages=pages, lanes=lanes, dtype=torch.float32, device=device)
        state.allocate_slots(0, 4)
        return sched, state, ModelRunner(model, state, device=device, vocab_limit=240)

    def turn(sched, runner, rid: str, prompt: list[int]) -> tuple[float, list[int]]:
        req = Request(rid, tuple(prompt), SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                      opener_start=len(prompt) - len(opener), last_is_user=True,
                      images=(image,) if vcfg.image_token_id in prompt else (),
                      must_cut_at=capture_cuts(len(prompt), None, len(prompt) - len(opener), 64))
        t0 = time.perf_counter()
        assert sched.add(req) is None
        first, out = None, []
        while sched.has_work:
            plan = sched.schedule()
            if plan.is_empty:
                continue
            result, _ = runner.run(plan)
            if device != "cpu":
                torch.cuda.synchronize()
            if rid in result.tokens:
                first = first or time.perf_counter() - t0
                out.append(result.tokens[rid])
            for ev in sched.update(result):
                runner.release(ev.req_id)
        return first, out

    text = lambda n: torch.randint(0, 240, (n,), generator=g).tolist()  # noqa: E731
    first = text(400) + image_span(vcfg, image) + text(60) + opener
    sched, state, runner = engine()
    turn(sched, runner, "warm-up", text(64) + opener)  # kernels and allocator warm on both sides
    _, answer = turn(sched, runner, "turn1", first)
    second = first + answer + text(40) + opener
    warm, _ = turn(sched, runner, "turn2", second)
    state.close()
    sched, state, runner = engine()
    turn(sched, runner, "warm-up", text(64) + opener)
    cold, _ = turn(sched, runner, "turn2-cold", second)
    state.close()
    return warm, cold


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--depth", type=int, default=8, help="vision blocks (Qwen3.5: 27)")
    ap.add_argument("--width", type=int, default=512, help="vision width (Qwen3.5: 1152)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a 2-block, 128-wide tower, 1 timed run (the test suite's)")
    ap.add_argument("--cpu-threads", type=int, default=None,
                    help="torch's math threads on the CPU (default: the engine's, usable CPUs minus one)")
    args = ap.parse_args(argv)
    from ignis.engine.config import default_cpu_threads

    torch.set_num_threads(args.cpu_threads or default_cpu_threads())
    print(f"{torch.get_num_threads()} math thread(s)")
    if args.quick:
        args.depth, args.width, args.repeats = 2, 128, 1
    vcfg = vision_config(args.depth, args.width, out_hidden=256)
    tower = random_tower(vcfg, args.device)
    ms = {}
    for side in SIZES:
        ms[side] = encode_ms(tower, side, args.repeats)
        tokens = (side // 32) ** 2
        print(f"encode {side}x{side} ({tokens} tokens, depth {args.depth}, width {args.width}, {args.device}): "
              f"{ms[side]:.1f} ms")
    ratio, encoded = conversation_hit_ratio(vcfg, args.device)
    print(f"10-turn conversation, 2 images re-sent every turn: cache hit ratio {ratio:.3f}, {encoded} encodes")
    side = 256 if args.quick else 512
    warm, cold = image_turn_ttft(vcfg, args.device, side)
    print(f"second turn of a conversation holding a {side}x{side} picture: TTFT warm {warm * 1e3:.1f} ms, "
          f"cold {cold * 1e3:.1f} ms")
    print(f"BENCH images encode_ms_256={ms[256]:.2f} encode_ms_512={ms[512]:.2f} encode_ms_768={ms[768]:.2f} "
          f"cache_hit_ratio={ratio:.3f} warm_cold_image_turn={warm / cold:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
