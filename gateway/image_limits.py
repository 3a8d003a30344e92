"""How many images one prompt may carry: ``--limit-mm-per-prompt`` as vLLM takes it.

The flag is JSON mapping a modality to a count (``'{"image": 4}'``) or a plain
number (the image count). Images are the one modality served: a ``video``
count is accepted only as 0, since video inputs are not supported yet. The
count is bounded by what one Generate may carry (``shared.wire_images``).
"""

from __future__ import annotations

import json

from ignis.shared.wire_images import MAX_IMAGES

DEFAULT_IMAGES_PER_PROMPT = 16


def parse_mm_limit(text: str | int | None) -> int:
    """The image count ``text`` allows (the default when None); ValueError for anything else."""
    if text is None:
        return DEFAULT_IMAGES_PER_PROMPT
    if isinstance(text, int) and not isinstance(text, bool):
        value: object = text
    else:
        try:
            value = json.loads(str(text))
        except ValueError:
            raise ValueError(f"--limit-mm-per-prompt takes JSON like '{{\"image\": 4}}' or a number, "
                             f"got {text!r}") from None
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"image", "video"})
        if unknown:
            raise ValueError(f"--limit-mm-per-prompt: modality {unknown[0]!r} is not served (image only)")
        if value.get("video", 0) != 0:
            raise ValueError("--limit-mm-per-prompt: video inputs are not supported yet")
        value = value.get("image", DEFAULT_IMAGES_PER_PROMPT)
    if type(value) is not int or not 0 <= value <= MAX_IMAGES:
        raise ValueError(f"--limit-mm-per-prompt: the image count must be an integer in [0, {MAX_IMAGES}], "
                         f"got {value!r}")
    return value
