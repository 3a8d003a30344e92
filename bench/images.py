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

The warm/cold TTFT of a turn repeating an image is measured where reuse keys
hold images (the gateway's image intake); its key joins the last line there
(``warm_cold_image_turn``, see ``BENCH_KEYS``).

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
BENCH_KEYS = ("encode_ms_256", "encode_ms_512", "encode_ms_768", "cache_hit_ratio")


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


def conversation_hit_ratio(vcfg, device: str, turns: int = 10) -> tuple[float, int]:
    """(encoder-cache hit ratio, images encoded) over a ``turns``-turn conversation re-sending its history."""
    from ignis.engine.models.config import config_from_dict
    from ignis.engine.models.hybrid import HybridModel
    from ignis.engine.models.state import ModelState
    from ignis.engine.request import Request
    from ignis.engine.runner import ModelRunner
    from ignis.engine.scheduler import Scheduler, SchedulerConfig
    from ignis.shared.sampling import SamplingParams

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
            n = (image.height // factor) * (image.width // factor)
            history += [vcfg.vision_start_token_id] + [vcfg.image_token_id] * n + [vcfg.vision_end_token_id]
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--depth", type=int, default=8, help="vision blocks (Qwen3.5: 27)")
    ap.add_argument("--width", type=int, default=512, help="vision width (Qwen3.5: 1152)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a 2-block, 128-wide tower, 1 timed run (the test suite's)")
    args = ap.parse_args(argv)
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
    # the gateway's image intake adds warm_cold_image_turn=B here (TTFT of a turn repeating an image, warm/cold)
    print(f"BENCH images encode_ms_256={ms[256]:.2f} encode_ms_512={ms[512]:.2f} encode_ms_768={ms[768]:.2f} "
          f"cache_hit_ratio={ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
