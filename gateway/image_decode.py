"""An image's encoded bytes -> the resized RGB picture the engine takes (``shared.image_input``).

Decoding is Pillow's, limited to PNG, JPEG, WebP and GIF (the first frame of
an animation). The decoded size is checked from the header before any pixel
is decoded: past ``max_source_pixels`` it is refused, and Pillow's own bomb
limit (``Image.MAX_IMAGE_PIXELS``) is set explicitly to the same bound
(``set_source_limit``, when the gateway starts), so a decompression bomb never
reaches memory. The picture then goes through
transformers' Qwen2-VL image processor's steps: RGB (transparency composited
onto white), resized to the patch grid (``shared.image_grid``) with PIL's
bicubic filter. Every failure is an ``ImageError`` whose text says what is
wrong with the image; the caller answers 400. No torch.
"""

from __future__ import annotations

import io

from PIL import Image, UnidentifiedImageError

from ignis.gateway.vision_settings import VisionSettings
from ignis.shared.image_input import ImageInput

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
_FORMAT_NAMES = "PNG, JPEG, WebP or GIF"



def set_source_limit(max_source_pixels: int) -> None:
    """Pillow's bomb limit: it warns past this many pixels and refuses past twice as many; ``decode_image``
    refuses past it, after reading only the image's header."""
    Image.MAX_IMAGE_PIXELS = max_source_pixels


class ImageError(ValueError):
    """An image that cannot be used; the message names why."""


def _to_rgb(image: Image.Image) -> Image.Image:
    """transformers' ``convert_to_rgb``: transparency composited onto a white background."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB") if image.mode != "RGB" else image


def decode_image(data: bytes, settings: VisionSettings, max_source_pixels: int) -> ImageInput:
    """The resized RGB picture of encoded image ``data``; ``ImageError`` when it cannot be one."""
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
        width, height = image.size
        if width * height > max_source_pixels:
            raise ImageError(f"the image is {width}x{height} pixels, more than the {max_source_pixels} accepted")
        image.seek(0)  # an animation's first frame
        image.load()
    except ImageError:
        raise
    except Image.DecompressionBombError:
        raise ImageError("the image decompresses to more pixels than accepted (a decompression bomb)") from None
    except UnidentifiedImageError:
        raise ImageError(f"the data is not a {_FORMAT_NAMES} image") from None
    except (OSError, ValueError, SyntaxError, EOFError, MemoryError) as e:  # truncated or corrupt image data
        raise ImageError(f"the image data is corrupt: {e}") from None
    if width < 1 or height < 1:
        raise ImageError(f"the image is {width}x{height} pixels")
    try:
        grid = settings.grid(height, width)
    except ValueError as e:
        raise ImageError(f"the image cannot be resized to the vision grid: {e}") from None
    rgb = _to_rgb(image)
    if (grid.width, grid.height) != rgb.size:
        rgb = rgb.resize((grid.width, grid.height), resample=Image.Resampling.BICUBIC)
    return ImageInput.from_rgb(rgb.tobytes(), grid.height, grid.width)
