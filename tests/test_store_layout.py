"""Issue 44: the field's layout both ways, index parts per add, float16 storage, old stores.

- A clip-retrieval folder (img_emb/, text_emb/, metadata/*.parquet), written here with numpy and
  pyarrow only, opens in place: searched, fitted on, never written; its encoder named by a flag
  and recorded beside it.
- A vlctl store is that layout: its shards and parquet columns read as clip-retrieval's.
- An ivfpq add writes its own part and leaves every earlier file as it was; the parts search as
  one index; the tuning's exact answers, brought up to date per add, equal a full scan's.
- float16 shards are half the bytes and search within rounding of float32.
- A store of an older vlctl is refused with its converting command, and converts unchanged.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vlctl.embeddings.search import IndexConfig
from vlctl.embeddings.store import create_store, open_store
from vlctl.embeddings.tuning import exact_neighbours
from vlctl.fsops import VlctlError

ENC = "test-encoder@0123456789abcdef"
COLORS = ("red", "green", "blue")


def _clustered(n: int, dim: int, seed: int = 0, centers: int = 30) -> np.ndarray:
    c = np.random.default_rng(123).standard_normal((centers, dim))
    rng = np.random.default_rng(seed)
    x = c[rng.integers(0, centers, n)] + 0.6 * rng.standard_normal((n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _files(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}


def _cli(argv: list, capsys) -> tuple[int, dict | str, str]:
    from vlctl.cli import main

    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 and "--json" in argv else out), err


def write_clip_retrieval(folder: Path, img: np.ndarray, txt: np.ndarray, parts: int) -> list[dict]:
    """clip-retrieval's documented output, with numpy and pyarrow alone: img_emb/img_emb_{i}.npy,
    text_emb/text_emb_{i}.npy, metadata/metadata_{i}.parquet (image_path, caption, color), row-aligned."""
    rows = [{"image_path": f"im/{i}.jpg", "caption": f"a {COLORS[i % 3]} thing", "color": COLORS[i % 3]}
            for i in range(len(img))]
    for d in ("img_emb", "text_emb", "metadata"):
        (folder / d).mkdir(parents=True)
    for i, sel in enumerate(np.array_split(np.arange(len(img)), parts)):
        np.save(folder / "img_emb" / f"img_emb_{i}.npy", img[sel])
        np.save(folder / "text_emb" / f"text_emb_{i}.npy", txt[sel])
        pq.write_table(pa.Table.from_pylist([rows[j] for j in sel]), folder / "metadata" / f"metadata_{i}.parquet")
    return rows


def test_a_clip_retrieval_folder_opens_in_place_and_is_never_written(tmp_path, capsys):
    from vlctl.encoders.tiny_model import create_model
    from vlctl.encoders.tiny_pretrained import save_pretrained

    save_pretrained(create_model("mad-quick", seed=0), tmp_path / "model")
    dim = 32  # the mad-quick TinyCLIP's
    img, txt = _clustered(120, dim, 0), _clustered(120, dim, 1)
    folder = tmp_path / "laion"
    rows = write_clip_retrieval(folder, img.astype(np.float16), txt.astype(np.float16), parts=12)  # img_emb_10 sorts before img_emb_2
    before = _files(folder)

    store = open_store(folder)
    assert store.read_only and not store.encoder_known and len(store) == 120 and len(store.texts_table) == 120
    assert store.metadata([0, 11, 119]) == [rows[0], rows[11], rows[119]]
    assert store.texts[:3] == [r["caption"] for r in rows[:3]] and store.image_of_text().tolist() == list(range(120))
    assert store.vectors([5]).dtype == np.float32 and np.array_equal(store.vectors([5]), img[[5]].astype(np.float16).astype(np.float32))
    q = _clustered(4, dim, 2)
    exact = np.argsort(-(q @ store.embeddings().T), axis=1, kind="stable")[:, :5]
    assert store.search(q, k=5).ids.tolist() == exact.tolist()
    with pytest.raises(VlctlError, match="a clip-retrieval folder is read in place and never written.*store convert"):
        store.add(img[:1])
    assert store.verify()["files"] == 12 * 4  # read whole (no hash recorded), rows counted; texts share metadata/

    np.save(tmp_path / "q.npy", q[0])
    rc, out, _ = _cli(["search", folder, "--embedding", tmp_path / "q.npy", "-k", "3", "--json"], capsys)
    assert rc == 0 and [h["id"] for h in out["hits"]] == exact[0, :3].tolist() and out["hits"][0]["image_path"]
    rc, _, err = _cli(["search", folder, "--text", "a red thing"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "records no encoder spec; pass --encoder SPEC" in err
    rc, _, err = _cli(["fit", "sae", "--store", folder, "--out", tmp_path / "sae", "--expansion", "2", "--k", "4",
                       "--epochs", "1", "--json"], capsys)
    assert rc == 0, err
    spec = f"tiny:{tmp_path / 'model'}"
    rc, out, err = _cli(["search", folder, "--text", "red", "--encoder", spec, "--json"], capsys)
    assert rc == 0 and len(out["hits"]) == 10, err
    named = json.loads((tmp_path / "laion.vlctl.json").read_text())  # beside the folder, not in it
    assert named["encoder_spec"] == spec and open_store(folder).encoder_known
    rc, out, err = _cli(["fit", "controlembed", "--store", folder, "--out", tmp_path / "ce", "--categories", "color", "--templates", "{}",
                         "--steps", "5", "--json"], capsys)
    assert rc == 0 and out["images"] == 120, err
    assert _files(folder) == before  # nothing in the folder changed, nothing was added to it

    rc, out, err = _cli(["store", "convert", folder, tmp_path / "copy", "--json"], capsys)
    assert rc == 0 and out["images"] == 120 and out["texts"] == 120, err
    copy = open_store(tmp_path / "copy")
    assert copy.metadata([7]) == [rows[7]] and copy.texts[7] == rows[7]["caption"] and copy.encoder_id == open_store(folder).encoder_id
    assert copy.search(q, k=5).ids.tolist() == exact.tolist()


def test_a_store_is_the_clip_retrieval_layout(tmp_path):
    x = _clustered(300, 16)
    meta = [{"path": f"p{i}.jpg", "color": COLORS[i % 3], **({"captions": ["c"]} if i % 2 else {})} for i in range(300)]
    s = create_store(tmp_path / "s", ENC, 16).add(x[:200], meta[:200]).add(x[200:], meta[200:])
    assert s.metadata([0, 1, 250]) == [meta[0], meta[1], meta[250]]
    emb = [np.load(f) for f in sorted((tmp_path / "s" / "img_emb").glob("*.npy"))]
    assert [f.name for f in sorted((tmp_path / "s" / "img_emb").iterdir())] == ["img_emb_00000.npy", "img_emb_00001.npy"]
    assert np.array_equal(np.concatenate(emb), s.embeddings())
    table = pa.concat_tables([pq.read_table(f) for f in sorted((tmp_path / "s" / "metadata").glob("*.parquet"))])
    assert table.column_names == ["path", "color", "captions"] and table.column("path").to_pylist() == [m["path"] for m in meta]
    # and the folder, without the manifest, reads as one
    assert open_store(tmp_path / "s").metadata([5]) == [meta[5]]


def test_ivfpq_adds_append_a_part_and_leave_every_earlier_file(tmp_path):
    import faiss

    x = _clustered(5000, 32)
    cfg = IndexConfig(kind="ivfpq", nlist=16, pq_m=8, nprobe=16, refine=5, target_recall=0.9, tune_queries=40)
    s = create_store(tmp_path / "s", ENC, 32, cfg).add(x[:2500])
    first = _files(tmp_path / "s")
    records = json.loads((tmp_path / "s" / "manifest.json").read_text())["index"]
    s = s.add(x[2500:4000]).add(x[4000:])
    after = _files(tmp_path / "s")
    assert {k: v for k, v in after.items() if k in first and k != "manifest.json"} == {
        k: v for k, v in first.items() if k != "manifest.json"}
    assert sorted(set(after) - set(first)) == ["img_emb/img_emb_00001.npy", "img_emb/img_emb_00002.npy",
                                               "index/part_00001.faiss", "index/part_00002.faiss",
                                               "metadata/metadata_00001.parquet", "metadata/metadata_00002.parquet"]
    index = s.manifest["index"]
    assert index["parts"][0] == records["parts"][0] and index["trained"] == records["trained"]
    assert [p["rows"] for p in index["parts"]] == [2500, 1500, 1000]
    # The parts search as one index holding every row under the same quantisers.
    one = faiss.read_index(str(tmp_path / "s" / "index" / "trained.faiss"))
    one.add(x)
    one.nprobe = s.index.nprobe
    q = _clustered(20, 32, 5)
    assert np.array_equal(s.index.search(q, 30)[1], one.search(q, 30)[1])
    # The tuning's answers, brought up to date per add from its own rows, are a full scan's.
    truth = index["tune_truth"]
    ids = np.asarray(truth["queries"])
    assert ids.max() < 2500 and len(ids) == 40
    assert truth["neighbours"] == exact_neighbours([x], ids, 10).tolist()
    assert open_store(tmp_path / "s").verify()["files"] == 3 * 2 + 4


@pytest.mark.parametrize("kind", ["ivfpq", "hnsw"])
def test_a_run_s_index_parts_merge_into_one(tmp_path, kind):
    """A run that commits in batches (embed --commit-every) wrote a part per batch; at its end its
    own parts merge into one file, the earlier parts and every shard untouched, and the store
    searches as before, row for row. A later add numbers its part after the merged shards."""
    import faiss

    x = _clustered(5000, 32)
    cfg = IndexConfig(kind=kind, nlist=16, pq_m=8, nprobe=16, refine=5, ef_search=200)
    s = create_store(tmp_path / "s", ENC, 32, cfg).add(x[:2500])
    for a, b in ((2500, 3000), (3000, 3500), (3500, 4000)):
        s = s.add(x[a:b])
    q = _clustered(20, 32, 5)
    before_files, before = _files(tmp_path / "s"), s.search(q, k=30)
    merged = s.merge_index_parts(1)
    after = _files(tmp_path / "s")
    assert sorted(set(before_files) - set(after)) == [f"index/part_0000{i}.faiss" for i in (1, 2, 3)]
    assert sorted(set(after) - set(before_files)) == ["index/part_00001_00003.faiss"]
    assert all(after[k] == v for k, v in before_files.items() if k in after and k != "manifest.json")
    assert [(p["file"], p["rows"]) for p in merged.manifest["index"]["parts"]] == [
        ("index/part_00000.faiss", 2500), ("index/part_00001_00003.faiss", 1500)]
    got = open_store(tmp_path / "s").search(q, k=30)
    if kind == "ivfpq":  # the same inverted lists, moved: the same answers
        assert np.array_equal(got.ids, before.ids) and np.allclose(got.scores, before.scores)
        one = faiss.read_index(str(tmp_path / "s" / "index" / "trained.faiss"))
        one.add(x[:4000])
        one.nprobe = 16
        assert np.array_equal(merged.index.search(q, 30)[1], one.search(q, 30)[1])
    else:  # a graph rebuilt over the same rows: the exact top 30 at this ef_search
        exact = np.argsort(-(q @ x[:4000].T), axis=1, kind="stable")[:, :30]
        assert np.array_equal(got.ids, exact)
    assert merged.merge_index_parts(1).manifest["generation"] == merged.manifest["generation"]  # nothing to merge
    grown = merged.add(x[4000:])
    assert grown.manifest["index"]["parts"][-1]["file"] == "index/part_00004.faiss" and grown.index.ntotal == 5000
    assert open_store(tmp_path / "s").verify()["files"] == 5 * 2 + 3 + (kind == "ivfpq")


def test_embed_into_an_indexed_store_keeps_a_part_per_run(tmp_path, capsys):
    """Issue 44 x 43: `embed --commit-every 2` into an hnsw store committed a part per batch; the
    run now leaves one, and a second run its own."""
    from PIL import Image

    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(5):
        Image.new("RGB", (20, 20), (i * 50, 255 - i * 50, 0)).save(photos / f"{i}.png")
    out = tmp_path / "s"
    argv = ["embed", photos, "--encoder", "open_clip:vlctl-tiny-vit?seed=0", "--out", out, "--no-progress",
            "--index-kind", "hnsw", "--commit-every", 2]
    assert _cli(argv, capsys)[0] == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["shards"]) == 3 and [(p["file"], p["rows"]) for p in manifest["index"]["parts"]] == [
        ("index/part_00000_00002.faiss", 5)]
    for i in range(5, 8):
        Image.new("RGB", (20, 20), (0, i * 30, 200)).save(photos / f"{i}.png")
    assert _cli(argv, capsys)[0] == 0
    s = open_store(out)
    assert [p["file"] for p in s.manifest["index"]["parts"]] == ["index/part_00000_00002.faiss",
                                                                  "index/part_00003_00004.faiss"]
    assert sorted(p.name for p in (out / "index").iterdir()) == ["part_00000_00002.faiss", "part_00003_00004.faiss"]
    assert s.index.ntotal == 8 and s.verify()["files"] == 5 * 2 + 2
    assert np.array_equal(s.search(s.embeddings(), k=1).ids[:, 0], np.arange(8))


def test_float16_halves_the_shards_and_searches_within_rounding(tmp_path):
    x = _clustered(3000, 64)
    q = _clustered(50, 64, 9)
    s32 = create_store(tmp_path / "a", ENC, 64).add(x)
    s16 = create_store(tmp_path / "b", ENC, 64, dtype="float16").add(x)
    size = lambda d: (d / "img_emb" / "img_emb_00000.npy").stat().st_size
    assert size(tmp_path / "b") - 128 == (size(tmp_path / "a") - 128) // 2 and s16.manifest["dtype"] == "float16"
    assert s16.embeddings().dtype == np.float32 and np.abs(s16.embeddings() - s32.embeddings()).max() < 1e-3
    a, b = s32.search(q, k=10), open_store(tmp_path / "b").search(q, k=10)
    assert np.mean([len(set(i) & set(j)) / 10 for i, j in zip(a.ids, b.ids)]) >= 0.98
    assert np.abs(a.scores - b.scores).max() < 2e-3


def test_an_old_store_is_refused_with_its_command_and_converts(tmp_path, capsys):
    x = _clustered(40, 8)
    old = tmp_path / "old"
    old.mkdir()
    np.save(old / "emb-00000.npy", x)
    (old / "meta-00000.jsonl").write_text("".join(json.dumps({"path": f"{i}.jpg"}) + "\n" for i in range(40)))
    np.save(old / "txt-00000.npy", x[:2])
    (old / "txtmeta-00000.jsonl").write_text('{"image": 0, "text": "a"}\n{"image": 1, "text": "b"}\n')
    shard = lambda n, e, m: {"rows": n, "embeddings": e, "metadata": m}
    (old / "manifest.json").write_text(json.dumps({
        "format": "vlctl.store/1", "encoder_id": ENC, "encoder_spec": None, "dim": 8, "count": 40, "generation": 1,
        "shards": [shard(40, "emb-00000.npy", "meta-00000.jsonl")],
        "texts": {"count": 2, "shards": [shard(2, "txt-00000.npy", "txtmeta-00000.jsonl")]},
        "index": {"config": {"kind": "flat"}, "file": "index-1.faiss"}}))
    before = _files(old)
    with pytest.raises(VlctlError, match=r"old/manifest.json: a store of an older vlctl .*`vlctl store convert .*old NEW_STORE`"):
        open_store(old)
    rc, out, err = _cli(["store", "convert", old, tmp_path / "new", "--json"], capsys)
    assert rc == 0 and out == {"store": str(tmp_path / "new"), "from": str(old), "images": 40, "texts": 2,
                               "index": "flat", "dtype": "float32"}, err
    new = open_store(tmp_path / "new")
    assert np.array_equal(new.embeddings(), x) and new.metadata([39]) == [{"path": "39.jpg"}]
    assert new.texts == ["a", "b"] and new.image_of_text().tolist() == [0, 1] and _files(old) == before
    rc, _, err = _cli(["search", old, "--embedding", tmp_path / "missing.npy"], capsys)
    assert rc == 2 and err.count("\n") == 1
