"""Retrieval recall@k (CLIP_benchmark's definition), RoCOCO mode, and `vlctl eval retrieval`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vlctl.cli import main
from vlctl.encoders.factory import create
from vlctl.encoders.tiny_model import create_model
from vlctl.encoders.tiny_pretrained import save_pretrained
from vlctl.eval.retrieval import embed_texts, retrieval_recall, rococo_recall
from vlctl.fsops import VlctlError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
ROCOCO = SHARED / "rococo" / "same_concept_first300.json"


def clip_benchmark_recall(image_emb, text_emb, image_of_text, ks):
    """CLIP_benchmark's zeroshot_retrieval metric code, re-typed (torch.topk + one-hot), as fractions."""
    img = torch.nn.functional.normalize(torch.as_tensor(image_emb, dtype=torch.float32), dim=-1)
    txt = torch.nn.functional.normalize(torch.as_tensor(text_emb, dtype=torch.float32), dim=-1)
    scores = txt @ img.T
    positive = torch.zeros_like(scores, dtype=torch.bool)
    positive[torch.arange(len(scores)), torch.as_tensor(image_of_text)] = True

    def recall(s, pos, k):
        top = torch.topk(s, min(k, s.shape[1]), dim=1)[1]  # CLIP_benchmark itself fails for k > n
        hit = (torch.nn.functional.one_hot(top, num_classes=s.shape[1]) * pos.view(len(s), 1, -1)).sum(dim=(1, 2))
        return hit / pos.sum(dim=1)

    out = {}
    for k in ks:
        out[f"t2i@{k}"] = (recall(scores, positive, k) > 0).float().mean().item()
        out[f"i2t@{k}"] = (recall(scores.T, positive.T, k) > 0).float().mean().item()
    return out


# --- the metric --------------------------------------------------------------------------------


def test_recall_hand_computed_with_a_six_caption_image():
    # Three images (unit axes); nine captions, all of norm sqrt(21), so cosines are entries / sqrt(21).
    # Image 0 has six captions, image 1 two, image 2 one.
    images = np.eye(3)
    texts = np.array([[4, 2, 1], [1, 4, 2], [2, 4, 1], [4, 1, 2], [-1, 2, 4], [4, -2, 1],  # image 0
                      [2, 1, 4], [-2, 4, 1],                                              # image 1
                      [4, -1, 2]], dtype=float)                                           # image 2
    owner = [0, 0, 0, 0, 0, 0, 1, 1, 2]
    r = retrieval_recall(images, texts, owner, ks=(1, 2, 3, 5))
    # t2i: rank of each caption's image in its column: 0 2 1 0 2 0 2 0 1.
    assert r["t2i@1"] == pytest.approx(100 * 4 / 9) and r["t2i@2"] == pytest.approx(100 * 6 / 9)
    assert r["t2i@3"] == r["t2i@5"] == 100.0
    # i2t, stable ties (lower caption index first):
    #   image 0 row 4 1 2 4 -1 4 2 -2 4: caption 0 is first              -> hit from k = 1
    #   image 1 row 2 4 4 1 2 -2 1 4 -1: caption 7 ties with 1, 2 at 4 -> rank 2, hit from k = 3
    #   image 2 row 1 2 1 2 4 1 4 1 2: caption 8 after 4, 6 and 1, 3      -> rank 4, hit from k = 5
    assert r["i2t@1"] == pytest.approx(100 / 3) and r["i2t@2"] == pytest.approx(100 / 3)
    assert r["i2t@3"] == pytest.approx(200 / 3) and r["i2t@5"] == 100.0


def test_recall_equals_clip_benchmark_on_random_embeddings():
    rng = np.random.default_rng(0)
    owner = np.concatenate([np.repeat(np.arange(40), 5), [7, 7, 7, 30, 30]])  # some images with 6 or 7 captions
    images = rng.normal(size=(40, 16))
    texts = images[owner] + 3.0 * rng.normal(size=(205, 16))  # captions near their image: recall in (0, 100)
    ours = retrieval_recall(images, texts, owner, ks=(1, 5, 10))
    ref = clip_benchmark_recall(images, texts, owner, (1, 5, 10))  # torch's float32 means: 1e-7 relative
    assert ours == pytest.approx({k: 100 * v for k, v in ref.items()}, rel=1e-6)
    assert 0 < ours["i2t@1"] < ours["i2t@10"] < 100 and 0 < ours["t2i@1"] < ours["t2i@10"] < 100


def test_image_without_captions_is_a_miss_as_in_clip_benchmark():
    images, texts = np.eye(2), np.array([[1.0, 0.0]])
    r = retrieval_recall(images, texts, [0], ks=(1,))
    assert r == {"i2t@1": 50.0, "t2i@1": 100.0}
    assert clip_benchmark_recall(images, texts, [0], (1,))["i2t@1"] == 0.5


def test_rococo_hand_computed():
    images = np.eye(2)
    orig = np.array([[0.866, 0.5], [0.6, 0.8]])  # image 0, image 1
    alt = np.array([[0.96, 0.28], [0.8, 0.6]])   # made from image 0, image 1
    r = rococo_recall(images, orig, [0, 1], alt, [0, 1], ks=(1, 2))
    assert r["clean"] == {"i2t@1": 100.0, "i2t@2": 100.0, "t2i@1": 100.0, "t2i@2": 100.0}
    # Image 0's row over the pool [o0, o1, a0, a1] is .866 .6 .96 .8: its altered caption comes first.
    assert r["with_altered"] == {"i2t@1": 50.0, "i2t@2": 100.0, "t2i@1": 100.0, "t2i@2": 100.0}
    assert r["altered_top1"] == 50.0 and r["own_altered_beats_original"] == 50.0
    assert r["drop"] == {"i2t@1": 50.0, "i2t@2": 0.0}
    # Both altered captions made from image 0 but pointing at image 1: image 1's best caption is an
    # altered one (altered_top1), yet not one of its own (own_altered_beats_original); image 0 keeps o0.
    r2 = rococo_recall(images, orig, [0, 1], np.array([[0.2, 0.98], [0.1, 0.99]]), [0, 0], ks=(1,))
    assert r2["altered_top1"] == 50.0 and r2["own_altered_beats_original"] == 0.0
    assert r2["with_altered"]["i2t@1"] == 50.0 and r2["clean"]["i2t@1"] == 100.0
    with pytest.raises(VlctlError, match="image_of_altered"):
        rococo_recall(images, orig, [0, 1], alt, [0, 2])


# --- the CLI -----------------------------------------------------------------------------------


def _jpeg(path: Path, rgb, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    a = np.full((30, 26, 3), rgb, np.uint8)
    a = np.clip(a.astype(int) + np.random.default_rng(seed).integers(-40, 40, a.shape), 0, 255).astype(np.uint8)
    Image.fromarray(a).save(path, quality=95)


def _embed_reference(spec: str, paths, captions):
    """Embeddings computed without vlctl's extraction code: PIL -> encoder.preprocess -> encode."""
    enc = create(spec)
    with torch.no_grad():
        x = torch.stack([enc.preprocess(np.asarray(Image.open(p).convert("RGB"))) for p in paths])
        img = enc.encode_images(x, normalize=True).numpy()
        txt = enc.encode_texts(enc.tokenize(captions), normalize=True).numpy()
    return img, txt


@pytest.fixture(scope="module")
def karpathy(tmp_path_factory):
    root = tmp_path_factory.mktemp("karpathy")
    save_pretrained(create_model("mad-quick", seed=0), root / "model")
    colors = {"red": (220, 20, 20), "green": (20, 200, 20), "blue": (20, 20, 220), "yellow": (230, 230, 20),
              "gray": (128, 128, 128), "magenta": (220, 20, 220)}
    images = []
    for i, (name, rgb) in enumerate(colors.items()):
        _jpeg(root / "imgs" / "val2014" / f"COCO_val2014_{i:012d}.jpg", rgb, i)
        caps = [{"raw": f"{name} {d}"} for d in ("1", "2", "3", "large", "small")]
        if i == 2:
            caps.append({"raw": "blue 9"})  # a sixth caption, as some COCO images have
        images.append({"filepath": "val2014", "filename": f"COCO_val2014_{i:012d}.jpg", "imgid": i,
                       "split": "test" if i < 5 else "train", "sentences": caps, "cocoid": i})
    (root / "dataset_coco.json").write_text(json.dumps({"images": images, "dataset": "coco"}))
    return root


def test_cli_karpathy_end_to_end_matches_clip_benchmark(karpathy, tmp_path, capsys):
    root = karpathy
    spec = f"tiny:{root / 'model'}"
    argv = ["eval", "retrieval", "--encoder", spec, "--dataset", "coco", "--root", str(root / "imgs"),
            "--annotations", str(root / "dataset_coco.json"), "--batch-size", "2", "--no-progress",
            "--out", str(tmp_path / "r.json"), "--json"]
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["n_images"] == 5 and res["n_captions"] == 26 and res["split"] == "test"
    assert json.loads((tmp_path / "r.json").read_text())["recall"] == res["recall"]
    doc = json.loads((root / "dataset_coco.json").read_text())["images"][:5]
    paths = [root / "imgs" / d["filepath"] / d["filename"] for d in doc]
    captions = [s["raw"] for d in doc for s in d["sentences"]]
    owner = [i for i, d in enumerate(doc) for _ in d["sentences"]]
    img, txt = _embed_reference(spec, paths, captions)
    ref = clip_benchmark_recall(img, txt, owner, (1, 5, 10))
    assert set(res["recall"]) == {"i2t@1", "i2t@5", "i2t@10", "t2i@1", "t2i@5", "t2i@10"}
    for k, v in ref.items():
        assert res["recall"][k] == pytest.approx(100 * v, rel=1e-6), k  # torch means in float32
    assert res["recall"]["t2i@5"] == 100.0  # 5 images: every caption's image is in the top 5


def test_cli_missing_images_are_named(karpathy, tmp_path, capsys):
    root = karpathy
    doc = json.loads((root / "dataset_coco.json").read_text())
    doc["images"][1]["filename"] = "COCO_val2014_gone.jpg"
    (tmp_path / "a.json").write_text(json.dumps(doc))
    rc = main(["eval", "retrieval", "--encoder", f"tiny:{root / 'model'}", "--dataset", "karpathy", "--root",
               str(root / "imgs"), "--annotations", str(tmp_path / "a.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "1 of 5 image files not found under" in err and "val2014/COCO_val2014_gone.jpg" in err
    assert "skip" not in err  # issue 43: it said "pass on_missing='skip' / --skip-missing", neither of which it has
    assert str((root / "imgs").resolve()) in err
    # An image that exists but cannot be decoded: a benchmark cannot skip it.
    broken = tmp_path / "imgs" / "x.jpg"
    broken.parent.mkdir()
    broken.write_bytes(b"junk")
    (tmp_path / "b.json").write_text(json.dumps([{"image": "x.jpg", "caption": ["red 1"]}]))
    rc = main(["eval", "retrieval", "--encoder", f"tiny:{root / 'model'}", "--dataset", "flickr", "--root",
               str(tmp_path / "imgs"), "--annotations", str(tmp_path / "b.json")])
    assert rc == 2 and "1 of 1 benchmark images could not be read" in capsys.readouterr().err


@pytest.mark.skipif(not ROCOCO.is_file(), reason="needs the real caption files in ../shared/data, a folder beside the clone (not in the repository)")
def test_cli_rococo_on_real_captions(tmp_path, capsys):
    """RoCOCO mode on the first 6 items of the real same-concept file, with tiny images in their place."""
    items = json.loads(ROCOCO.read_text())[:6]
    for i, it in enumerate(items):
        _jpeg(tmp_path / "coco" / it["image"], (40 * i, 255 - 40 * i, 100), i)
    (tmp_path / "rococo.json").write_text(json.dumps(items))
    # The MiniLM text tower reads any English caption (the word tokenizer knows only MAD's words).
    save_pretrained(create_model("mad-minilm", seed=0, context_length=64), tmp_path / "model")
    spec = f"tiny:{tmp_path / 'model'}"
    assert main(["eval", "retrieval", "--encoder", spec, "--dataset", "rococo", "--root", str(tmp_path / "coco"),
                 "--annotations", str(tmp_path / "rococo.json"), "--no-progress", "--ks", "1", "5", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["n_images"] == 6 and res["n_captions"] == 30 and res["n_altered_captions"] == 30
    img, _ = _embed_reference(spec, [tmp_path / "coco" / it["image"] for it in items], ["x"])
    enc = create(spec)
    orig = embed_texts(enc, [c for it in items for c in it["caption"][:5]])
    alt = embed_texts(enc, [c for it in items for c in it["caption"][5:]])
    owner = np.repeat(np.arange(6), 5)
    want = rococo_recall(img, orig, owner, alt, owner, ks=(1, 5))
    assert res["recall"] == pytest.approx(want["with_altered"]) and res["clean"] == pytest.approx(want["clean"])
    assert res["altered_top1"] == pytest.approx(want["altered_top1"])
    # with_altered i2t is the clean i2t with distractors added: it can only drop
    assert all(res["recall"][k] <= res["clean"][k] for k in ("i2t@1", "i2t@5"))
    assert res["recall"]["t2i@1"] == res["clean"]["t2i@1"]
