"""The one image reader (`vlctl.images`) on the messy folder's files: what each file becomes."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from messy_folder import make_messy_folder
from vlctl.images import BACKGROUND, ImageDecodeError, decode_image, read_image


@pytest.fixture(scope="module")
def messy(tmp_path_factory):
    return make_messy_folder(tmp_path_factory.mktemp("messy"))


def _pixels(path) -> np.ndarray:
    return np.asarray(read_image(path), dtype=np.int64)


def test_every_image_reads_as_8_bit_rgb(messy):
    for rel in messy.images:
        im = read_image(messy.photos / rel)
        assert im.mode == "RGB" and min(im.size) >= 8, rel


def test_the_16_bit_png_reads_as_its_8_bit_twin_not_white(messy):
    # PIL's own convert("RGB") clips 16-bit samples at 255: the photo came out white.
    got, want = _pixels(messy.photos / "twins/gray16.png"), _pixels(messy.photos / "twins/gray8.png")
    assert np.array_equal(got, want) and got.mean() < 200


def test_exif_orientation_is_applied(messy):
    got, want = _pixels(messy.photos / "twins/exif_orientation_6.jpg"), _pixels(messy.photos / "twins/upright.jpg")
    assert got.shape == want.shape == (200, 300, 3)
    assert np.abs(got - want).mean() < 3  # two JPEG encodings of the same pixels


def test_cmyk_jpeg_reads_as_its_rgb_twin(messy):
    got, want = _pixels(messy.photos / "twins/coffee_cmyk.jpg"), _pixels(messy.photos / "twins/coffee_rgb.png")
    assert got.shape == want.shape and np.abs(got - want).mean() < 3


@pytest.mark.parametrize("rel", ["twins/pages.tif", "twins/animated.gif"])
def test_multi_frame_files_give_their_first_frame_and_say_so(messy, rel):
    read = decode_image(messy.photos / rel)
    assert np.array_equal(np.asarray(read.image), _pixels(messy.photos / messy.twins[rel]))
    assert read.frames == 2 and read.note == "the first of its 2 frames used"
    assert decode_image(messy.photos / messy.twins[rel]).note is None


def test_transparent_pixels_are_on_white(messy):
    assert np.all(_pixels(messy.photos / "transparent.png")[:, :100] == BACKGROUND)
    pal = Image.open(messy.photos / "coins_palette_transparent.png")
    clear = np.asarray(pal) == 0  # the transparent palette entry
    assert clear.any() and np.all(_pixels(messy.photos / "coins_palette_transparent.png")[clear] == BACKGROUND)


def test_float_images_scale_by_their_range():
    for values, want in (([0.0, 0.5, 1.0], [0, 128, 255]), ([-2.0, 0.0, 2.0], [0, 128, 255])):
        buf = io.BytesIO()
        Image.fromarray(np.array([values], np.float32)).save(buf, format="TIFF")
        buf.seek(0)
        assert np.asarray(read_image(buf))[0, :, 0].tolist() == want


@pytest.mark.parametrize(("rel", "reason"), [("empty.jpg", "empty file (0 bytes)"),
                                             ("truncated.jpg", "image file is truncated"),
                                             ("notes.jpg", "its bytes are no image format PIL reads")])
def test_broken_files_name_themselves_and_the_reason(messy, rel, reason):
    with pytest.raises(ImageDecodeError, match="notes|empty|truncated") as e:
        read_image(messy.photos / rel)
    assert str(e.value).startswith(str(messy.photos / rel)) and reason in str(e.value)


def test_a_bomb_is_refused_from_its_header():
    buf = io.BytesIO()
    Image.new("L", (100, 60)).save(buf, format="PNG")
    buf.seek(0)
    with pytest.raises(ImageDecodeError, match="100 x 60 = 6000 pixels exceeds the limit of 5000"):
        read_image(buf, 5000, name="x.png")
