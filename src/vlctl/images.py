"""Reading image files: one reader for every command, with a pixel limit and clear errors.

A file that cannot be decoded (corrupt, truncated, not an image) or that is a decompression bomb
(more pixels than `max_pixels`, checked from the header before any pixel is decoded) raises
`ImageDecodeError`, a `VlctlError` whose message names the file and the reason.
"""

from __future__ import annotations

import os
import warnings
from typing import IO

from vlctl.fsops import VlctlError

# PIL's own default (Image.MAX_IMAGE_PIXELS): ~89.5 Mpx, a 1024 x 1024 x 3 x 85 byte budget.
DEFAULT_MAX_PIXELS = 89_478_485


class ImageDecodeError(VlctlError):
    """One image file could not be used (its path and the reason are in the message)."""



class ImageTooLargeError(ImageDecodeError):
    """The image has more pixels than the limit (or PIL refused it as a decompression bomb)."""


def read_image(path: str | os.PathLike | IO[bytes], max_pixels: int = DEFAULT_MAX_PIXELS, *,
               name: str | None = None, formats: list[str] | None = None):
    """Open and fully decode an image as RGB PIL image, or raise ImageDecodeError
    (ImageTooLargeError for one over `max_pixels`).

    The pixel count is checked from the header, before decoding, so a decompression bomb never
    allocates its pixels. Truncated files are errors (PIL's LOAD_TRUNCATED_IMAGES is not used).
    `path` may be a binary file object, which messages call `name`; `formats` limits the decoders
    PIL tries (e.g. to the format sniffed from the bytes).
    """
    from PIL import Image, UnidentifiedImageError

    name = path if name is None else name
    try:
        with warnings.catch_warnings():
            # PIL warns above MAX_IMAGE_PIXELS and raises above twice that; our own limit decides.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path, formats=formats) as im:
                w, h = im.size
                if w * h > max_pixels:
                    raise ImageTooLargeError(
                        f"{name}: {w} x {h} = {w * h} pixels exceeds the limit of {max_pixels} "
                        "(possible decompression bomb; refused)"
                    )
                return im.convert("RGB")
    except ImageDecodeError:
        raise
    except Image.DecompressionBombError as e:
        raise ImageTooLargeError(f"{name}: refused as a decompression bomb ({e})") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as e:
        raise ImageDecodeError(f"{name}: cannot decode image ({type(e).__name__}: {e})") from None
