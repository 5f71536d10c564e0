"""Issue 43: a real, messy photo folder (tests/messy_folder.py) through every command of the README's
walkthrough, `audit`, `explain`, `cluster` and the README's `--rerank tevi:` search, from the
command line only: no traceback, every broken file listed by name with its reason and nothing else,
and each variant embedded as the plain file it must read as."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest

from messy_folder import make_messy_folder
from vlctl.cli import main

ENCODER = "open_clip:ViT-S-32"  # random weights, seeded: offline, and the same in every process


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(the folder's parent, where the commands run; the `MessyFolder`)."""
    root = tmp_path_factory.mktemp("messy")
    return root, make_messy_folder(root)


def _vlctl(root: Path, capfd, line: str, json_out: bool = True):
    """Run `vlctl LINE` in `root` -> (exit code, the --json result or stdout, stderr)."""
    import os

    here = os.getcwd()
    os.chdir(root)
    try:
        rc = main([*shlex.split(line), *(["--json"] if json_out else [])])
    finally:
        os.chdir(here)
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err, f"vlctl {line}:\n{err}"
    return rc, (json.loads(out) if json_out and rc == 0 and out.strip() else out), err


def test_every_command_on_the_messy_folder(run, capfd):
    root, messy = run
    photos = messy.photos

    def vlctl(line, json_out=True):
        rc, result, err = _vlctl(root, capfd, line, json_out)
        assert rc == 0, f"vlctl {line} failed (exit {rc}):\n{err}"
        return result, err

    # embed: every image in, the five broken files listed with their reasons, nothing else.
    emb, _ = vlctl(f"embed photos/ --annotations photos/captions.csv --encoder {ENCODER} --out store/")
    assert emb["added"] == len(messy.images) and emb["failed"] == len(messy.broken)
    listed = {Path(p).relative_to(photos.resolve()).as_posix(): why for p, why in emb["failures"]}
    assert sorted(listed) == messy.broken
    assert "empty file (0 bytes)" in listed["empty.jpg"] and "truncated" in listed["truncated.jpg"]
    assert "no image format" in listed["notes.jpg"] and "thumbnail cache" in listed["Thumbs.db"]
    assert "AppleDouble" in listed["._chelsea.png"]
    assert sorted(Path(p).relative_to(photos.resolve()).as_posix() for p, _ in emb["notes"]) == sorted(messy.multi_frame)
    # Without --json the same list comes at the end of the output, one line a file.
    again, err = vlctl(f"embed photos/ --annotations photos/captions.csv --encoder {ENCODER} --out store/",
                       json_out=False)
    assert "added: 0" in again and f"skipped {len(messy.broken)} unreadable files" in err
    assert "truncated.jpg: cannot decode image" in err.rstrip().splitlines()[-1]  # the list ends the output
    for name in messy.broken:
        assert sum(name in line for line in err.splitlines()) == 1, name
    rc, _, err = _vlctl(root, capfd, f"embed photos/ --encoder {ENCODER} --out strict-store/ --strict")
    assert rc == 2 and "--strict" in err and len(err.strip().splitlines()) == 1 and not (root / "strict-store").exists()

    # What each variant became: its twin's embedding.
    from vlctl.embeddings.store import open_store
    from vlctl.encoders.factory import create

    store = open_store(root / "store")
    row = {Path(m["path"]).relative_to(photos.resolve()).as_posix(): i for i, m in enumerate(store.metadata())}
    vec = store.vectors(np.arange(len(store)))

    def cos(a, b):
        return float(vec[row[a]] @ vec[row[b]])

    assert cos("twins/gray16.png", "twins/gray8.png") == pytest.approx(1.0, abs=1e-6)
    assert cos("twins/pages.tif", "twins/rocket_page1.png") == pytest.approx(1.0, abs=1e-6)
    assert cos("twins/animated.gif", "twins/astronaut_frame1.png") == pytest.approx(1.0, abs=1e-6)
    assert cos("twins/coffee_cmyk.jpg", "twins/coffee_rgb.png") > 0.999  # JPEG's loss only
    enc = create(ENCODER)
    from PIL import Image

    with Image.open(photos / "twins/exif_orientation_6.jpg") as im:
        sideways = enc.embed_images([np.asarray(im.convert("RGB"))])[0]  # the stored pixels, unrotated
    upright = cos("twins/exif_orientation_6.jpg", "twins/upright.jpg")
    assert upright > 0.999 and upright > float(vec[row["twins/exif_orientation_6.jpg"]] @ sideways) + 0.005
    white = enc.embed_images([np.full((200, 256, 3), 255, np.uint8)])[0]
    assert float(vec[row["twins/gray16.png"]] @ white) < 0.99  # it was 0.99999988: embedded as white

    # The walkthrough's other commands, and the README's TEVI rerank of a text search.
    vlctl("search store/ --text 'a photo of a tabby cat' -k 5")
    vlctl("fit sae --store store/ --out sae/ --d-latent 64 --k 8 --epochs 5")
    vlctl("fit tevi --store store/ --sae sae/ --out tevi/ --epochs 5")
    vlctl("score tevi --store store/ --tevi tevi/ --rerank 10 --out scores.npz")
    vlctl("search store/ --text 'a red car' -k 10")
    reranked, _ = vlctl("search store/ --text 'a red car' --rerank tevi:tevi/ -k 10")
    assert reranked["query"]["rerank"] == "tevi:tevi/" and len(reranked["hits"]) == 10
    from vlctl.embeddings.results import exact_rerank
    from vlctl.methods.tevi.estimator import TEVI
    from vlctl.methods.tevi.scoring import fuse

    tevi = TEVI.load(root / "tevi", encoder_id=store.encoder_id)
    q = enc.embed_texts(["a red car"])
    top100 = np.argsort(-(vec @ q[0]), kind="stable")[:100]
    clip = exact_rerank(q, top100[None], store)[0]
    alone = np.asarray(tevi.scores(vec[top100], q))[:, 0]
    # the README's command reranks by the fused score at the model's alpha (issue 41), --alpha 0 by TEVI alone
    want = fuse(clip, alone, tevi.alpha_)
    assert [h["id"] for h in reranked["hits"]] == top100[np.argsort(-want, kind="stable")[:10]].tolist()
    reranked, _ = vlctl("search store/ --text 'a red car' --rerank tevi:tevi/ --alpha 0 -k 10")
    assert [h["id"] for h in reranked["hits"]] == top100[np.argsort(-alone, kind="stable")[:10]].tolist()
    vlctl("fit controlembed --store store/ --labels photos/labels.csv --out controlembed/ --steps 30")
    vlctl("search store/ --image 'photos/trips/2019/café au lait.jpg' --attribute subject --controlembed controlembed/ -k 5")
    # An attribute the model was not trained on: one warning line, not Python's file:line and source.
    _, err = vlctl("search store/ --image photos/coffee.jpg --attribute color --controlembed controlembed/ -k 2")
    assert err.startswith("vlctl: warning: attribute 'color' was not trained on") and err.count("\n") == 1, err
    # A flag the query would ignore is refused (the hits equalled a plain text search).
    rc, _, err = _vlctl(root, capfd, "search store/ --text cat --attribute subject --controlembed controlembed/")
    assert rc == 2 and "--attribute goes with --image" in err and len(err.strip().splitlines()) == 1
    vlctl("cluster store/ --attribute subject --controlembed controlembed/ --k 6 --out clusters/")
    assert len(list((root / "clusters").glob("cluster_*.png"))) == 6
    for image in ("photos/tiny 8x8.png", "photos/twins/exif_orientation_6.jpg", "photos/twins/gray16.png"):
        got, _ = vlctl(f"explain --encoder {ENCODER} '{image}' 'a photo of a tabby cat' 'a photo of a dog' "
                       f"--out 'explain/{Path(image).stem}/'")
        assert any(f.endswith("dire.png") for f in got["files"])

    # audit: the broken files its captions name are skipped and listed, the rest audited.
    audit, _ = vlctl(f"audit --encoder {ENCODER} --pairs photos/captions.csv --out audit/ --n-worst 2")
    assert sorted(Path(p).name for p, _ in audit["failures"]) == ["empty.jpg", "truncated.jpg"]
    summary = json.loads((root / "audit" / "summary.json").read_text())
    assert summary["images"] == len(messy.images) and summary["failed"] == 2

    # Every form of pairs the help names: a folder with --annotations (a CSV with a BOM and Windows
    # line endings), the store, a TSV beside the folder, the same TSV moved away with --images.
    quick = f"audit --encoder {ENCODER} --max-pairs 4 --n-worst 1"
    folder, _ = vlctl(f"{quick} --pairs photos/ --annotations photos/captions_bom.csv --out audit-folder/")
    assert sorted(Path(p).name for p, _ in folder["failures"]) == sorted(Path(b).name for b in messy.broken)
    stored, _ = vlctl(f"{quick} --pairs store/ --out audit-store/")
    assert stored["failed"] == 0 and stored["items"] > 0
    vlctl(f"{quick} --pairs captions.tsv --out audit-tsv/")
    (root / "elsewhere").mkdir()
    (root / "elsewhere" / "captions.tsv").write_text((root / "captions.tsv").read_text().replace("photos/", ""))
    rc, _, err = _vlctl(root, capfd, f"{quick} --pairs elsewhere/captions.tsv --out audit-x/")
    assert rc == 2 and "none of the" in err and "--images DIR" in err
    vlctl(f"{quick} --pairs elsewhere/captions.tsv --images photos/ --out audit-moved/")
