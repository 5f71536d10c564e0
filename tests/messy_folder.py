"""A messy photo folder, as a real collection is: generated at test time from scikit-image's photos
(no binary file is committed). Issue 43 ran every command on such a folder.

`make_messy_folder(root)` writes root/photos/ with
- real photos in their own formats, crops and rotations, names with spaces and non-ASCII characters,
  nested subfolders;
- twins, each a variant and the plain 8-bit RGB file it must read as: a JPEG with EXIF Orientation
  6 (stored sideways) and its upright JPEG, a 16-bit grayscale PNG and its 8-bit PNG, a CMYK JPEG
  and its RGB PNG, a two-page TIFF and its first page, an animated GIF and its first frame;
- the other variants: grayscale, palette and transparent PNGs (alpha and palette transparency),
  a GIF, WebP, BMP and TIFF, an 8 x 8 image and a 4000 x 300 panorama;
- five broken files: zero bytes, a truncated JPEG, a text file named .jpg, Thumbs.db, ._chelsea.png;
- captions as CSV, TSV (paths relative to the folder above), JSONL and CSV with a BOM and Windows
  line endings, and labels.csv (filepath, subject).

It returns a `MessyFolder` naming each of them.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np

BROKEN = {"empty.jpg": "empty", "truncated.jpg": "truncated", "notes.jpg": "text", "Thumbs.db": "thumbs",
          "._chelsea.png": "appledouble"}
TEXT = {"astronaut": "an astronaut in a space suit", "chelsea": "a tabby cat", "coffee": "a cup of coffee",
        "rocket": "a rocket on a launch pad", "camera": "a man with a camera", "coins": "old coins"}


@dataclasses.dataclass
class MessyFolder:
    photos: Path
    images: dict[str, str]  # relative path -> subject, every file that is an image
    twins: dict[str, str]  # variant -> the plain file it must read as (relative paths)
    broken: list[str]  # relative paths of the broken files
    multi_frame: list[str]  # files of which the first frame is used


def _save(photos: Path, rel: str, image, **kw) -> str:
    path = photos / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, **kw)
    return rel


def make_messy_folder(root: Path) -> MessyFolder:
    import skimage.data
    from PIL import Image

    photos = root / "photos"
    photos.mkdir(parents=True)
    src = {name: getattr(skimage.data, name)() for name in TEXT}
    rgb = {k: Image.fromarray(v).convert("RGB") for k, v in src.items()}
    images: dict[str, str] = {}
    twins: dict[str, str] = {}

    def add(rel: str, subject: str, image, **kw) -> str:
        images[_save(photos, rel, image, **kw)] = subject
        return rel

    # Real photos in their own formats, crops and rotations, odd names, nested folders.
    add("astronaut.png", "astronaut", rgb["astronaut"])
    add("chelsea_01.jpg", "chelsea", rgb["chelsea"], quality=90)
    add("coffee.jpg", "coffee", rgb["coffee"], quality=90)
    add("rocket.jpg", "rocket", rgb["rocket"], quality=90)
    add("camera gray.jpg", "camera", Image.fromarray(src["camera"]), quality=90)  # mode L
    add("trips/2019/café au lait.jpg", "coffee", rgb["coffee"].crop((50, 40, 350, 300)), quality=85)
    add("trips/Zürich/rakete – start.png", "rocket", rgb["rocket"].crop((100, 0, 400, 427)))
    add("trips/2019/astronaut crop.jpg", "astronaut", rgb["astronaut"].crop((100, 50, 400, 350)), quality=90)
    add("chelsea_rot90.jpg", "chelsea", rgb["chelsea"].rotate(90, expand=True), quality=90)
    add("chelsea_crop.webp", "chelsea", rgb["chelsea"].crop((100, 0, 400, 300)), quality=90)
    add("astronaut.bmp", "astronaut", rgb["astronaut"].resize((256, 256)))
    add("coffee.tif", "coffee", rgb["coffee"].resize((300, 200)))
    add("coins.gif", "coins", Image.fromarray(src["coins"]).convert("P"))
    add("rocket_palette.png", "rocket", rgb["rocket"].quantize(64))
    add("tiny 8x8.png", "chelsea", rgb["chelsea"].resize((8, 8)))
    add("panorama.jpg", "astronaut", rgb["astronaut"].resize((4000, 300)), quality=85)

    # Twins: the variant and the plain file it must read as.
    upright = rgb["chelsea"].crop((0, 0, 300, 200))
    add("twins/upright.jpg", "chelsea", upright, quality=95)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to show": stored turned a quarter counter-clockwise
    twins[add("twins/exif_orientation_6.jpg", "chelsea", upright.rotate(90, expand=True), quality=95,
              exif=exif)] = "twins/upright.jpg"
    gray8 = np.asarray(Image.fromarray(src["camera"]).resize((256, 200)))
    add("twins/gray8.png", "camera", Image.fromarray(gray8))
    twins[add("twins/gray16.png", "camera", Image.fromarray(gray8.astype(np.uint16) * 257))] = "twins/gray8.png"
    coffee = rgb["coffee"].resize((240, 160))
    add("twins/coffee_rgb.png", "coffee", coffee)
    twins[add("twins/coffee_cmyk.jpg", "coffee", coffee.convert("CMYK"), quality=95)] = "twins/coffee_rgb.png"
    page1, page2 = rgb["rocket"].resize((96, 128)), rgb["coins"].resize((96, 128))
    add("twins/rocket_page1.png", "rocket", page1)
    twins[add("twins/pages.tif", "rocket", page1, save_all=True, append_images=[page2])] = "twins/rocket_page1.png"
    frame1 = rgb["astronaut"].resize((128, 128)).quantize(256)
    add("twins/astronaut_frame1.png", "astronaut", frame1.convert("RGB"))
    frames = [frame1, rgb["rocket"].resize((128, 128)).quantize(256)]
    twins[add("twins/animated.gif", "astronaut", frames[0], save_all=True, append_images=frames[1:],
              duration=200, loop=0)] = "twins/astronaut_frame1.png"
    # Transparency: on white, as the reader states.
    cut = np.asarray(rgb["coins"].resize((200, 150)).convert("RGBA")).copy()
    cut[:, :100, 3] = 0
    add("transparent.png", "coins", Image.fromarray(cut))
    la = Image.fromarray(np.dstack([src["coins"][:150, :200], np.full((150, 200), 128, np.uint8)]), "LA")
    add("coins_la.png", "coins", la)
    pal = rgb["coins"].resize((200, 150)).quantize(16)
    add("coins_palette_transparent.png", "coins", pal, transparency=0)
    # Rows so every subject has at least two images.
    add("camera.png", "camera", Image.fromarray(src["camera"]).resize((256, 256)))

    # Broken files.
    (photos / "empty.jpg").write_bytes(b"")
    whole = (photos / "chelsea_01.jpg").read_bytes()
    (photos / "truncated.jpg").write_bytes(whole[: len(whole) // 3])
    (photos / "notes.jpg").write_text("shopping list: milk, eggs\n")
    (photos / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(504))
    (photos / "._chelsea.png").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        " + bytes(64))

    # Captions in every table form, labels.
    rows = [{"filepath": rel, "caption": f"a photo of {TEXT[subject]}"} for rel, subject in sorted(images.items())]
    with open(photos / "captions.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["filepath", "caption"])
        w.writeheader()
        w.writerows(rows + [{"filepath": b, "caption": "a broken file"} for b in ("empty.jpg", "truncated.jpg")])
    with open(photos / "captions_bom.csv", "w", newline="", encoding="utf-8-sig") as f:
        w = csv.DictWriter(f, fieldnames=["filepath", "caption"], lineterminator="\r\n")
        w.writeheader()
        w.writerows(rows)
    # The TSV lives beside the folder and names images under it: photos/...
    with open(root / "captions.tsv", "w", newline="", encoding="utf-8") as f:
        f.write("filepath\tcaption\n")
        f.writelines(f"photos/{r['filepath']}\t{r['caption']}\n" for r in rows)
    with open(photos / "captions.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"image": r["filepath"], "caption": r["caption"]}, ensure_ascii=False) + "\n"
                     for r in rows)
    with open(photos / "labels.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["filepath", "subject"])
        w.writeheader()
        w.writerows({"filepath": rel, "subject": s} for rel, s in sorted(images.items()))
    return MessyFolder(photos, images, twins, sorted(BROKEN), ["twins/pages.tif", "twins/animated.gif"])
