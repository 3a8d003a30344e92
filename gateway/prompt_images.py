"""A chat prompt's images: read, decoded and resized, and their placeholders expanded to their token count.

The template renders each image part as ``<|vision_start|><|image_pad|><|vision_end|>``
(one pad token). Once every image is read (``gateway.image_sources``) and
resized to the vision grid (``gateway.image_decode``), each pad token becomes
as many pad tokens as the image takes, ``grid_h * grid_w / merge ** 2``
(transformers' Qwen2-VL processor does the same to the text), and the capture
marks computed on the unexpanded prompt move past the pads inserted before
them. A mark is a boundary between tokens of the unexpanded prompt, so it
never lands inside an image. The checks, each a 400 that names the part:
images sent to a model with no vision side, more images than
``--limit-mm-per-prompt``, an image that cannot be read, and a prompt whose
pad tokens do not match its images one to one (an ``<|image_pad|>`` written
in text, or an image part the template did not render).
"""

from __future__ import annotations

from ignis.gateway.errors import invalid
from ignis.gateway.image_decode import ImageError, decode_image
from ignis.gateway.image_sources import MediaPolicy, data_url_bytes, image_bytes
from ignis.gateway.prompt_work import PromptWork
from ignis.gateway.vision_settings import VisionSettings
from ignis.shared.image_input import ImageInput


def check_image_count(count: int, vision: VisionSettings | None, limit: int) -> None:
    """400 for images a model cannot take, or more than ``limit`` of them."""
    if count and vision is None:
        raise invalid("this model takes no images (it has no vision encoder, or is served with --language-model-only)", "messages", code="images_not_supported")
    if count > limit:
        raise invalid(f"{count} images in the messages, at most {limit} allowed per prompt "
                      f"(--limit-mm-per-prompt)", "messages", code="too_many_images")


async def load_images(urls: list[str], vision: VisionSettings, policy: MediaPolicy, max_source_pixels: int,
                      work: PromptWork) -> tuple[ImageInput, ...]:
    """Each URL's picture resized to the vision grid, in order; 400 naming the first that fails."""
    out = []
    for k, url in enumerate(urls):
        try:
            if isinstance(url, str) and url[:5].lower() == "data:":  # base64 of a big image: off the event loop
                data = await work.run_image(data_url_bytes, url, policy.max_bytes)
            else:
                data = await image_bytes(url, policy)
            out.append(await work.run_image(decode_image, data, vision, max_source_pixels))
        except ImageError as e:
            raise invalid(f"image {k + 1} of the messages: {e}", "messages", code="invalid_image") from None
    return tuple(out)


def image_tokens(image: ImageInput, vision: VisionSettings) -> int:
    """Pad tokens a resized picture takes in the prompt."""
    factor = vision.patch_size * vision.merge_size
    return (image.height // factor) * (image.width // factor)


def refuse_stray_placeholders(ids: list[int], vision: VisionSettings | None, param: str) -> None:
    """A prompt sent without images holds no image placeholder token (there is no picture to put there):
    a 400 ``invalid_image`` naming ``param``."""
    if vision is not None and vision.image_token_id in ids:
        raise invalid(f"the prompt holds the image placeholder token (id {vision.image_token_id}, <|image_pad|>) "
                      f"but no image was sent: placeholders are made from image parts, never written", param,
                      code="invalid_image")


def expand_placeholders(ids: list[int], images: tuple[ImageInput, ...], vision: VisionSettings,
                        marks: dict) -> tuple[list[int], dict]:
    """``ids`` with each image's one pad token repeated to its token count, and the marks
    (``system_end``, ``opener_start``, ``part_end``; None stays None) moved past the inserted pads."""
    pad = vision.image_token_id
    at = [i for i, t in enumerate(ids) if t == pad]
    if len(at) != len(images):
        raise invalid(f"the rendered prompt holds {len(at)} image placeholders for {len(images)} images (an "
                      f"<|image_pad|> written in text, or an image part the chat template does not render)",
                      "messages", code="invalid_image")
    counts = [image_tokens(im, vision) for im in images]
    out: list[int] = []
    prev = 0
    for pos, n in zip(at, counts):
        out.extend(ids[prev:pos])
        out.extend([pad] * n)
        prev = pos + 1
    out.extend(ids[prev:])

    def moved(mark: int | None) -> int | None:
        if mark is None:
            return None
        return mark + sum(n - 1 for pos, n in zip(at, counts) if pos < mark)

    return out, {k: moved(v) if k in ("system_end", "opener_start", "part_end") else v for k, v in marks.items()}
