"""Prompts with images, for the engine's and the gateway's image tests: where their pad runs
stand, and transformers' greedy tokens for them (``generate`` with its own image processor).

torch is imported where the reference runs: the gateway's HTTP tests use ``pad_runs`` alone.
"""

from __future__ import annotations


def pad_runs(ids: list[int], pad: int) -> list[tuple[int, int]]:
    """(start, length) of each run of ``pad`` tokens in ``ids``: one run per image."""
    runs, i = [], 0
    while i < len(ids):
        if ids[i] == pad:
            j = i
            while j < len(ids) and ids[j] == pad:
                j += 1
            runs.append((i, j - i))
            i = j
        else:
            i += 1
    return runs


def hf_greedy(model, vcfg, prompt: list[int], pictures, pad: int, max_new_tokens: int, **generate_kwargs):
    """transformers' greedy ``generate`` of ``model`` (a ``Qwen3_5ForConditionalGeneration``) on
    ``prompt``, the pictures preprocessed by its processor set up like ``vcfg``:
    -> (generate's output, the processor's features). ``generate_kwargs`` go to ``generate``."""
    import torch

    from tests.engine.models.vision_reference import hf_processor

    feats = hf_processor(vcfg)(images=pictures, return_tensors="pt")
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             pixel_values=feats["pixel_values"], image_grid_thw=feats["image_grid_thw"],
                             mm_token_type_ids=(ids == pad).int(), max_new_tokens=max_new_tokens,
                             do_sample=False, **generate_kwargs)
    return out, feats
