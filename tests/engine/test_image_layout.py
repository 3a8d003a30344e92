"""engine.image_layout: placeholder runs matched to images, and mRoPE positions equal to transformers'."""

import functools
import random
import types

import pytest
import torch

from ignis.engine.image_layout import image_layout
from ignis.shared.image_input import ImageInput

PAD = 9


def _image(gh: int, gw: int, factor: int = 8) -> ImageInput:
    return ImageInput.from_rgb(bytes(gh * factor * gw * factor * 3), gh * factor, gw * factor)


def _prompt(rng, grids):
    ids = [rng.randrange(20, 40) for _ in range(rng.randrange(1, 5))]
    for gh, gw in grids:
        ids += [7] + [PAD] * (gh * gw) + [8] + [rng.randrange(20, 40) for _ in range(rng.randrange(0, 6))]
    return ids


def _reference(ids, grids):
    """transformers' get_rope_index for Qwen3.5 (merge size 1 on an already merged grid)."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5Model

    fake = types.SimpleNamespace(
        config=types.SimpleNamespace(vision_config=types.SimpleNamespace(spatial_merge_size=2)),
        get_vision_position_ids=functools.partial(Qwen3_5Model.get_vision_position_ids, None))
    input_ids = torch.tensor([ids])
    thw = torch.tensor([[1, 2 * gh, 2 * gw] for gh, gw in grids]) if grids else None
    pos, delta = Qwen3_5Model.get_rope_index(fake, input_ids, (input_ids == PAD).int(), image_grid_thw=thw)
    return pos[:, 0].tolist(), int(delta)


def test_docstring_example():
    ids = [1, 2] + [PAD] * 6 + [3, 4]
    lay = image_layout(ids, [_image(2, 3)], PAD, 8)
    assert lay.positions(0, 10) == ([0, 1, 2, 2, 2, 2, 2, 2, 5, 6], [0, 1, 2, 2, 2, 3, 3, 3, 5, 6],
                                    [0, 1, 2, 3, 4, 2, 3, 4, 5, 6])
    assert lay.delta == -3 and lay.delta_at(8) == -3 and lay.delta_at(7) == 0


@pytest.mark.parametrize("seed", range(6))
def test_positions_equal_transformers_for_any_range(seed):
    rng = random.Random(seed)
    grids = [(rng.randrange(1, 5), rng.randrange(1, 6)) for _ in range(rng.randrange(0, 4))]
    ids = _prompt(rng, grids)
    lay = image_layout(ids, [_image(gh, gw) for gh, gw in grids], PAD, 8)
    want, delta = _reference(ids, grids)
    assert lay.delta == delta
    for _ in range(20):
        a = rng.randrange(0, len(ids))
        b = rng.randrange(a + 1, len(ids) + 1)
        got = lay.positions(a, b)
        if got is None:
            got = tuple([p + lay.delta_at(a) for p in range(a, b)] for _ in range(3))
            assert all(lay.delta_at(p) == lay.delta_at(a) for p in range(a, b))
        assert list(got) == [row[a:b] for row in want], (a, b)


def test_mismatches_are_refused():
    ids = [1] + [PAD] * 4 + [2]
    with pytest.raises(ValueError, match="2 images"):
        image_layout(ids, [_image(2, 2), _image(1, 1)], PAD, 8)
    with pytest.raises(ValueError, match="takes 6"):
        image_layout(ids, [_image(2, 3)], PAD, 8)
    with pytest.raises(ValueError, match="multiple of 8"):
        image_layout(ids, [ImageInput.from_rgb(bytes(12 * 16 * 3), 12, 16)], PAD, 8)
    assert image_layout([1, 2], [], PAD, 8).delta == 0
