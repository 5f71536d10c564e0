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


def _matrix_profile(description: str, colorants, gamma: float = 2.2) -> bytes:
    """An ICC v2 RGB display profile of `colorants` (the D50 XYZ of red, green and blue) and one
    gamma curve: what a camera's Adobe RGB JPEG embeds, written here so nothing is downloaded."""
    import struct

    def s15(v: float) -> bytes:
        return struct.pack(">i", round(v * 65536))

    def xyz(x: float, y: float, z: float) -> bytes:
        return b"XYZ \0\0\0\0" + s15(x) + s15(y) + s15(z)

    text = description.encode("ascii") + b"\0"
    desc = b"desc\0\0\0\0" + struct.pack(">I", len(text)) + text + b"\0" * 8 + b"\0\0\0" + b"\0" * 67
    curve = b"curv\0\0\0\0" + struct.pack(">IH", 1, round(gamma * 256)) + b"\0\0"
    white = (0.9642, 1.0, 0.8249)  # D50
    tags = [(b"desc", desc), (b"wtpt", xyz(*white)), (b"rXYZ", xyz(*colorants[0])), (b"gXYZ", xyz(*colorants[1])),
            (b"bXYZ", xyz(*colorants[2])), (b"rTRC", curve), (b"gTRC", curve), (b"bTRC", curve)]
    offset, table, data = 128 + 4 + 12 * len(tags), b"", b""
    for sig, body in tags:
        body += b"\0" * (-len(body) % 4)
        table += sig + struct.pack(">II", offset + len(data), len(body))
        data += body
    size = offset + len(data)
    header = (struct.pack(">I", size) + b"lcms" + struct.pack(">I", 0x02100000) + b"mntrRGB XYZ " + b"\0" * 12
              + b"acsp" + b"\0" * 24 + struct.pack(">I", 0) + s15(white[0]) + s15(white[1]) + s15(white[2]))
    header += b"\0" * (128 - len(header))
    return header + struct.pack(">I", len(tags)) + table + data


ADOBE_RGB_D50 = ((0.60974, 0.31111, 0.01947), (0.20528, 0.62567, 0.06087), (0.14919, 0.06322, 0.74457))


def _tagged(pixels: np.ndarray, icc: bytes | None, fmt: str = "PNG") -> io.BytesIO:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt, **({"icc_profile": icc} if icc else {}))
    buf.seek(0)
    return buf


def test_an_icc_profile_is_converted_to_srgb():
    """Issue 43: the pixels of a wide-gamut (Adobe RGB) file were read as if they were sRGB, so its
    colours came out duller than any viewer shows them. Converted to sRGB they are more saturated:
    the same numbers mean a stronger green in the wider space. An sRGB profile changes nothing, and
    a profile that does not fit (LAB on an RGB image) leaves the pixels as stored."""
    from PIL import ImageCms

    pixels = np.zeros((32, 16, 3), np.uint8)  # one JPEG block row (16 px, chroma subsampled) of each colour
    pixels[:16] = (120, 160, 120)  # a muted green, inside sRGB's gamut in both readings
    pixels[16:] = (128, 128, 128)
    naive = np.asarray(read_image(_tagged(pixels, None)), dtype=np.int64)
    assert np.array_equal(naive, pixels)
    adobe = _matrix_profile("Adobe RGB (1998)-like, written by the test", ADOBE_RGB_D50)
    for fmt in ("PNG", "JPEG"):
        got = np.asarray(read_image(_tagged(pixels, adobe, fmt)), dtype=np.int64)
        stored = np.asarray(Image.open(_tagged(pixels, adobe, fmt)).convert("RGB"), dtype=np.int64)
        green, was = got[4, 4], stored[4, 4]
        assert green[1] - green[0] > was[1] - was[0] + 15, (fmt, green)  # more saturated
        assert 0 < green[0] < was[0] and green[1] >= was[1] - 2, (fmt, green)  # inside the gamut, not clipped
        assert np.abs(got[24, 4] - stored[24, 4]).max() <= 3, fmt  # gray stays gray (gamma 2.2 ~ sRGB's curve)
    want = ImageCms.profileToProfile(Image.fromarray(pixels), ImageCms.ImageCmsProfile(io.BytesIO(adobe)),
                                     ImageCms.createProfile("sRGB"), outputMode="RGB")
    assert np.array_equal(np.asarray(read_image(_tagged(pixels, adobe))), np.asarray(want))
    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    lab = ImageCms.ImageCmsProfile(ImageCms.createProfile("LAB")).tobytes()
    for icc in (srgb, lab):
        assert np.array_equal(np.asarray(read_image(_tagged(pixels, icc)), dtype=np.int64), naive)
