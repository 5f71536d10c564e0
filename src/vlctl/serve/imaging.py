"""Pixels in and out of `vlctl serve`: uploads checked from their bytes, thumbnails, heatmap overlays.

An upload's type is decided by its first bytes (the magic number), never by the name or the
Content-Type the client sent; PIL must then agree. Its pixel count is read from the header and
refused above the limit before any pixel is decoded (a decompression bomb allocates nothing).
"""

from __future__ import annotations

import base64
import io

import numpy as np

from vlctl.fsops import VlctlError

# (magic bytes at offset 0, the PIL format name); WEBP is "RIFF....WEBP".
SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),  # little-endian TIFF
    (b"MM\x00*", "TIFF"),  # big-endian TIFF
)
MEDIA_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "BMP": "image/bmp", "WEBP": "image/webp",
               "TIFF": "image/tiff"}


class UploadError(VlctlError):
    """An upload refused: `status` is the HTTP status to answer with (415 type, 413 size, 400 decode)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def sniff(data: bytes) -> str | None:
    """The image format of `data` from its magic number ("PNG", "JPEG", "GIF", "BMP", "WEBP", "TIFF"), or None."""
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    for magic, fmt in SIGNATURES:
        if data.startswith(magic):
            return fmt
    return None


def decode_upload(data: bytes, max_pixels: int) -> np.ndarray:
    """Upload bytes -> uint8 RGB (H, W, 3); UploadError (415, 413 or 400) with one clear message."""
    from vlctl.images import ImageDecodeError, ImageTooLargeError, read_image

    fmt = sniff(data)
    if fmt is None:
        raise UploadError("upload: not an image (its bytes are none of PNG, JPEG, GIF, BMP, WEBP, TIFF)", 415)
    try:  # the one image reader: its pixel limit (from the header) and its decode errors
        rgb = np.asarray(read_image(io.BytesIO(data), max_pixels, name=f"upload ({fmt})", formats=[fmt]),
                         dtype=np.uint8)
    except ImageTooLargeError as e:
        raise UploadError(str(e), 413) from None
    except ImageDecodeError as e:
        raise UploadError(str(e), 400) from None
    if min(rgb.shape[:2]) < 1:
        raise UploadError("upload: the image has no pixels", 400)
    return rgb


def resize_to(rgb: np.ndarray, side: int, pixelated: bool) -> np.ndarray:
    """The image scaled so its longer side is `side` (nearest-neighbour for pixelated sets)."""
    from PIL import Image

    h, w = rgb.shape[:2]
    s = side / max(h, w)
    size = (max(1, round(w * s)), max(1, round(h * s)))
    if size == (w, h):
        return rgb
    method = Image.Resampling.NEAREST if pixelated else Image.Resampling.LANCZOS
    return np.asarray(Image.fromarray(rgb).resize(size, method))


def png(rgb: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgb)).save(buf, format="PNG")
    return buf.getvalue()


def data_url(png_bytes: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes).decode("ascii")


def colour_bar(scale, width: int = 256, height: int = 12) -> bytes:
    """The colour bar of a `vlctl.report.overlays.ColourScale` as a PNG, vmin at the left."""
    cmap = scale.bar_cmap()
    row = (np.asarray(cmap(np.linspace(0.0, 1.0, width)))[:, :3] * 255).round().astype(np.uint8)
    return png(np.repeat(row[None], height, axis=0))
