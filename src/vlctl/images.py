"""Reading image files: the one reader of every command, the web page and the Python front door.

`read_image` (and `decode_image`, which also says whether frames were dropped) turns any image file
PIL decodes (JPEG, PNG, GIF, WebP, BMP, TIFF, ...) into the 8-bit RGB image the encoders take, the
same way everywhere:

- EXIF orientation is applied (a phone's portrait JPEG is stored sideways with Orientation 6).
- 16-bit images are scaled from their full range, 0..65535 -> 0..255 (an 8-bit image saved as
  16-bit, value x 257, comes back exactly); 32-bit integer images are read the same way (values
  outside 0..65535 clipped); float images from [0, 1] when all values lie in it, otherwise from
  their own minimum..maximum. PIL's own conversion would clip them, so a 16-bit photo came out white.
- An embedded ICC profile other than sRGB's (a wide-gamut camera JPEG, a CMYK press profile, a
  gray one) is converted to sRGB with littleCMS (`PIL.ImageCms`), as a browser shows the file; an
  sRGB profile leaves the pixels as stored, and so does a profile that does not fit the image
  (a broken tag is no reason to lose the file).
- CMYK, palette, grayscale and YCbCr images are converted to RGB; transparent pixels (an alpha
  channel, a transparent palette entry or colour) are composited on `BACKGROUND`, white.
- Of an animated or multipage file (GIF, WebP, TIFF) the first frame is used, and
  `DecodedImage.note` says so.
- A file with more pixels than `max_pixels` is refused from its header, before any pixel is
  decoded (a decompression bomb never allocates its pixels).

A file that cannot be used (corrupt, truncated, not an image, too large) raises `ImageDecodeError`,
a `VlctlError` whose message names the file and the reason. Callers that read many files skip and
list such files (`vlctl.embeddings.extract.embed_image_files`); `--strict` makes them stop instead.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import warnings
from typing import IO, Any

from vlctl.fsops import VlctlError

# PIL's own default (Image.MAX_IMAGE_PIXELS): ~89.5 Mpx, a 1024 x 1024 x 3 x 85 byte budget.
DEFAULT_MAX_PIXELS = 89_478_485
# Transparent pixels are composited on this colour (documents and logos are drawn on white).
BACKGROUND = (255, 255, 255)
# Modes whose samples are wider than 8 bits: PIL's convert("RGB") clips them instead of scaling.
_WIDE_INT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
# Modes whose embedded ICC profile is converted to sRGB (littleCMS transforms 8-bit samples).
_ICC_MODES = ("RGB", "RGBA", "CMYK", "L")


class ImageDecodeError(VlctlError):
    """One image file could not be used (its path and the reason are in the message)."""


class ImageTooLargeError(ImageDecodeError):
    """The image has more pixels than the limit (or PIL refused it as a decompression bomb)."""


@dataclasses.dataclass(frozen=True)
class DecodedImage:
    """An image file as read: `image` the RGB PIL image; `frames` how many frames (pages) the file
    holds, of which the first was used."""

    image: Any
    frames: int = 1

    @property
    def note(self) -> str | None:
        """What a user should be told about the read, or None: the frames that were not used."""
        return f"the first of its {self.frames} frames used" if self.frames > 1 else None


def decode_image(path: str | os.PathLike | IO[bytes], max_pixels: int = DEFAULT_MAX_PIXELS, *,
                 name: str | None = None, formats: list[str] | None = None) -> DecodedImage:
    """Open and fully decode an image file (module docstring), or raise ImageDecodeError
    (ImageTooLargeError for one over `max_pixels`).

    Truncated files are errors (PIL's LOAD_TRUNCATED_IMAGES is not used). `path` may be a binary
    file object, which messages call `name`; `formats` limits the decoders PIL tries (e.g. to the
    format sniffed from the bytes).
    """
    from PIL import Image, UnidentifiedImageError

    name = str(path) if name is None else name
    if isinstance(path, (str, os.PathLike)) and os.path.isfile(path) and os.path.getsize(path) == 0:
        raise ImageDecodeError(f"{name}: empty file (0 bytes)")
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
                if w * h == 0:
                    raise ImageDecodeError(f"{name}: the image has no pixels ({w} x {h})")
                frames = int(getattr(im, "n_frames", 1) or 1)
                im.seek(0)
                im.load()
                return DecodedImage(to_rgb(im), frames)
    except ImageDecodeError:
        raise
    except Image.DecompressionBombError as e:
        raise ImageTooLargeError(f"{name}: refused as a decompression bomb ({e})") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError, TypeError) as e:
        reason = ("its bytes are no image format PIL reads" if isinstance(e, UnidentifiedImageError)
                  else f"{type(e).__name__}: {e}")
        raise ImageDecodeError(f"{name}: cannot decode image ({reason})") from None


def read_image(path: str | os.PathLike | IO[bytes], max_pixels: int = DEFAULT_MAX_PIXELS, *,
               name: str | None = None, formats: list[str] | None = None):
    """The RGB PIL image of an image file (`decode_image` without its note)."""
    return decode_image(path, max_pixels, name=name, formats=formats).image


def to_rgb(im):
    """A decoded PIL image of any mode -> 8-bit RGB, upright (module docstring for the rules).
    Also applied to PIL images handed to the Python front door, so they read as files do."""
    import numpy as np
    from PIL import Image, ImageOps

    try:
        im = ImageOps.exif_transpose(im)
    except Exception:  # noqa: BLE001, S110 -- malformed EXIF: the orientation is unknown, keep the pixels as stored
        pass
    im = _to_srgb(im)
    if im.mode in _WIDE_INT_MODES or im.mode == "F":
        return Image.fromarray(_to_uint8(np.asarray(im))).convert("RGB")
    if im.mode == "RGB":
        return im
    if im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in im.info:
        rgba = im.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (*BACKGROUND, 255))
        return Image.alpha_composite(canvas, rgba).convert("RGB")
    return im.convert("RGB")


def _to_srgb(im):
    """`im` converted from its embedded ICC profile to sRGB; `im` itself without a profile, with
    sRGB's, or with one that does not fit its mode (module docstring)."""
    icc = im.info.get("icc_profile")
    if not icc or im.mode not in _ICC_MODES:
        return im
    from PIL import ImageCms

    try:
        profile = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        if "srgb" in ImageCms.getProfileDescription(profile).lower():
            return im  # already sRGB: a transform would only add rounding
        return ImageCms.profileToProfile(im, profile, _srgb(), outputMode="RGBA" if im.mode == "RGBA" else "RGB")
    except (ImageCms.PyCMSError, OSError, ValueError, TypeError):
        return im  # a profile littleCMS cannot read or apply to this mode: the pixels as stored


@functools.lru_cache(maxsize=1)
def _srgb():
    from PIL import ImageCms

    return ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB"))


def _to_uint8(a):
    """Samples of a 16-bit, 32-bit integer or float image -> uint8 (module docstring)."""
    import numpy as np

    if a.dtype.kind == "f":
        a = np.nan_to_num(a.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        lo, hi = (0.0, 1.0) if a.size and a.min() >= 0.0 and a.max() <= 1.0 else (float(a.min()), float(a.max()))
        scaled = (a - lo) / (hi - lo) * 255.0 if hi > lo else np.zeros_like(a)
        return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)
    wide = np.clip(a.astype(np.int64), 0, 65535)
    return ((wide * 255 + 32767) // 65535).astype(np.uint8)  # round(x / 257): exact for x = 257 * v
