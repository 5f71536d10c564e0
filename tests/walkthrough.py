"""The own-folder walkthrough's data: a folder of real photos of mixed sizes, one corrupt file, a
caption CSV and a label CSV, as a user would bring them (README, "Your own model and images")."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

SUBJECTS = {"astronaut": "an astronaut in a space suit", "chelsea": "a tabby cat", "coffee": "a cup of coffee",
            "rocket": "a rocket on a launch pad"}
PER_SUBJECT = 10


def make_photo_folder(root: Path) -> Path:
    """root/photos/: 40 crops of four scikit-image photos (sizes 96..400 px, landscape and
    portrait), `broken.jpg` (not an image), `captions.csv` (filepath, caption) and `labels.csv`
    (filepath, subject, orientation). Returns root/photos."""
    import skimage.data
    from PIL import Image

    photos = root / "photos"
    photos.mkdir(parents=True)
    rng = np.random.default_rng(0)
    captions, labels = [], []
    for subject, text in SUBJECTS.items():
        img = getattr(skimage.data, subject)()
        h, w = img.shape[:2]
        for i in range(PER_SUBJECT):
            ch, cw = int(rng.integers(h // 3, h)), int(rng.integers(w // 3, w))
            y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
            name = f"{subject}_{i:02d}.{'png' if i % 3 == 0 else 'jpg'}"
            Image.fromarray(img[y : y + ch, x : x + cw]).save(photos / name)
            captions.append({"filepath": name, "caption": f"a photo of {text}"})
            labels.append({"filepath": name, "subject": subject, "orientation": "landscape" if cw >= ch else "portrait"})
    (photos / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not really a JPEG")
    for file, rows in (("captions.csv", captions), ("labels.csv", labels)):
        with open(photos / file, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return photos
