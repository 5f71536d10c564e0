"""Gallery index: exact search against numpy, ANN recall, incremental add, atomicity, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import vlctl.embeddings.parts as parts_mod
import vlctl.embeddings.store as gallery_mod
import vlctl.embeddings.table as table_mod
from vlctl.embeddings.results import exact_rerank
from vlctl.embeddings.search import IndexConfig
from vlctl.embeddings.store import create_gallery, open_gallery, open_or_create_gallery
from vlctl.encoders.tiny_encoder import TinyCLIPEncoder
from vlctl.encoders.tiny_model import create_model
from vlctl.fsops import VlctlError

ENC = "test-encoder@0123456789abcdef"


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _clustered(n: int, dim: int, seed: int = 0, centers: int = 50) -> np.ndarray:
    """Embedding-like data: unit vectors around a few directions (ANN on pure noise is meaningless)."""
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centers, dim))
    return _unit(c[rng.integers(0, centers, n)] + 0.6 * rng.standard_normal((n, dim)))


def _exact_topk(gallery_x: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-(q @ gallery_x.T), axis=1, kind="stable")[:, :k]


def test_flat_search_is_exact_across_adds_and_reopen(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((700, 16)).astype(np.float32) * 3  # not normalised: add normalises
    g = create_gallery(tmp_path / "g", ENC, 16)
    g = g.add(x[:400], [{"path": f"img{i}.jpg", "note": f"line\nbreak \u00e9 {i}"} for i in range(400)])
    g = g.add(x[400:], [{"path": f"img{i}.jpg"} for i in range(400, 700)], encoder_id=ENC)
    g = open_gallery(tmp_path / "g", encoder_id=ENC)
    assert len(g) == 700 and g.manifest["generation"] == 2 and len(g.manifest["shards"]) == 2
    xn = _unit(x)
    assert np.allclose(g.vectors([0, 399, 400, 699]), xn[[0, 399, 400, 699]])
    q = rng.standard_normal((20, 16)).astype(np.float32)
    res = g.search(q, k=5)
    ref_scores = _unit(q) @ xn.T
    ref_top = np.sort(ref_scores, axis=1)[:, ::-1][:, :5]
    assert np.allclose(res.scores, ref_top, atol=1e-5)
    assert np.allclose(np.take_along_axis(ref_scores, res.ids, 1), res.scores, atol=1e-5)
    hits = res.hits(g)
    assert hits[0][0]["path"] == f"img{res.ids[0, 0]}.jpg" and hits[0][0]["id"] == res.ids[0, 0]
    assert g.metadata([399, 400, 7]) == [
        {"path": "img399.jpg", "note": "line\nbreak \u00e9 399"}, {"path": "img400.jpg"},
        {"path": "img7.jpg", "note": "line\nbreak \u00e9 7"},
    ]  # fmt: skip
    assert len(g.metadata()) == 700
    g.verify()


def test_k_larger_than_gallery_and_empty_gallery(tmp_path):
    g = create_gallery(tmp_path / "g", ENC, 4)
    empty = g.search(np.ones(4, np.float32), k=3)
    assert (empty.ids == -1).all() and np.isneginf(empty.scores).all()
    g = g.add(np.eye(4, dtype=np.float32)[:2])
    res = g.search(np.array([1, 0.5, 0, 0], np.float32), k=4)
    assert res.ids.tolist() == [[0, 1, -1, -1]]
    assert np.isneginf(res.scores[0, 2:]).all()
    expected = [{"id": 0, "score": pytest.approx(2 / np.sqrt(5))}, {"id": 1, "score": pytest.approx(1 / np.sqrt(5))}]
    assert res.hits(g) == [expected]


@pytest.mark.parametrize(
    "config",
    [
        IndexConfig(kind="ivfpq", nlist=64, pq_m=8, nprobe=16, refine=10),
        IndexConfig(kind="hnsw", hnsw_m=16, ef_search=64),
    ],
    ids=["ivfpq", "hnsw"],
)
def test_approximate_indexes_recall_against_exact(tmp_path, config):
    x = _clustered(6000, 32)
    q = _clustered(100, 32, seed=1)
    g = create_gallery(tmp_path / "g", ENC, 32, config).add(x)
    res = open_gallery(tmp_path / "g").search(q, k=10)
    exact = _exact_topk(x, q, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(res.ids, exact)])
    assert recall >= 0.9, recall
    assert g.manifest["index"]["faiss_type"] == {"ivfpq": "IndexIVFPQ", "hnsw": "IndexHNSWFlat"}[config.kind]
    # Later adds go into the trained index; the new rows are found.
    g = g.add(x[:5] * -1)
    assert g.search(x[:5] * -1, k=1).ids[:, 0].tolist() == [6000, 6001, 6002, 6003, 6004]


def test_ivfpq_refine_uses_exact_scores(tmp_path):
    x = _clustered(3000, 32)
    g = create_gallery(tmp_path / "g", ENC, 32, IndexConfig(kind="ivfpq", nlist=16, pq_m=4, nprobe=16)).add(x)
    res = g.search(x[:10], k=3)
    assert res.ids[:, 0].tolist() == list(range(10))  # PQ alone confuses near neighbours; re-scoring does not
    assert np.allclose(res.scores, np.take_along_axis(x[:10] @ x.T, res.ids, 1), atol=1e-5)
    with pytest.raises(VlctlError, match=r"needs at least .* rows"):
        create_gallery(tmp_path / "small", ENC, 32, IndexConfig(kind="ivfpq", nlist=16, pq_m=4)).add(x[:100])
    with pytest.raises(VlctlError, match="pq_m=5 does not divide the embedding dim 32"):
        create_gallery(tmp_path / "bad_m", ENC, 32, IndexConfig(kind="ivfpq", nlist=16, pq_m=5)).add(x)


def test_reranker_hook_reorders_candidates(tmp_path):
    x = _clustered(500, 8)
    g = create_gallery(tmp_path / "g", ENC, 8).add(x, [{"year": int(i % 7)} for i in range(500)])
    calls = []

    def newest_first(queries, candidate_ids, gallery):
        calls.append(candidate_ids.shape)
        years = np.array([[m["year"] for m in gallery.metadata(row)] for row in candidate_ids], np.float32)
        return years + exact_rerank(queries, candidate_ids, gallery)  # year first, similarity breaks ties

    res = g.search(x[:3], k=5, reranker=newest_first, candidates=50)
    assert calls == [(3, 50)]
    assert all(h["year"] == 6 for hits in res.hits(g) for h in hits)
    base = g.search(x[:3], k=50).ids
    assert all(set(r) <= set(b) for r, b in zip(res.ids, base))  # only the index's candidates
    with pytest.raises(VlctlError, match=r"reranker returned scores of shape \(3, 2\), expected \(3, 50\)"):
        g.search(x[:3], k=5, reranker=lambda q, ids, gal: np.zeros((3, 2)), candidates=50)


def test_search_by_text_and_image_with_an_encoder(tmp_path):
    enc = TinyCLIPEncoder(create_model("mad-quick", seed=0))
    other = TinyCLIPEncoder(create_model("mad-quick", seed=1))
    images = np.random.default_rng(0).integers(0, 256, (12, 28, 28, 3), dtype=np.uint8)
    x = enc.preprocess_batch(images)
    emb = enc.encode_images(x).numpy()
    g = create_gallery(tmp_path / "g", enc.id, enc.embed_dim).add(emb, [{"n": i} for i in range(12)])
    assert g.search_images(enc, x[:4], k=1).ids[:, 0].tolist() == [0, 1, 2, 3]
    res = g.search_texts(enc, ["red 3", "blue 7"], k=12)
    t = enc.encode_texts(enc.tokenize(["red 3", "blue 7"])).numpy()
    assert res.ids.tolist() == _exact_topk(_unit(emb), t, 12).tolist()
    with pytest.raises(VlctlError, match="store was built with encoder 'tinyclip-mad-quick@"):
        g.search_texts(other, ["red 3"])
    with pytest.raises(VlctlError, match="built with encoder"):
        open_gallery(tmp_path / "g", encoder_id=other.id)
    with pytest.raises(VlctlError, match="built with encoder"):
        g.add(emb, encoder_id=other.id)
    # the store's rows are x / ||x|| in numpy (search.normalise), bit for bit; torch's normalize may differ by
    # an ulp on some CPUs' SIMD paths
    assert np.array_equal(g.vectors([3]), emb[3:4] / np.linalg.norm(emb[3:4], axis=1, keepdims=True))


def test_bad_input_errors_name_the_file(tmp_path):
    x = _clustered(50, 8)
    g = create_gallery(tmp_path / "g", ENC, 8).add(x)
    with pytest.raises(VlctlError, match="embeddings have dim 9, the store at .* has dim 8"):
        g.add(np.ones((3, 9), np.float32))
    with pytest.raises(VlctlError, match="queries have dim 4"):
        g.search(np.ones((1, 4), np.float32))
    with pytest.raises(VlctlError, match="3 embeddings but 2 metadata rows"):
        g.add(x[:3], [{}, {}])
    with pytest.raises(VlctlError, match="not JSON-serialisable"):
        g.add(x[:1], [{"a": object()}])
    with pytest.raises(VlctlError, match="already exists and is not an empty directory"):
        create_gallery(tmp_path / "g", ENC, 8)
    with pytest.raises(VlctlError, match="store uses index"):
        open_or_create_gallery(tmp_path / "g", ENC, 8, IndexConfig(kind="hnsw"))
    assert len(open_gallery(tmp_path / "g")) == 50  # still readable after every refusal

    shard = tmp_path / "g" / "img_emb" / "img_emb_00000.npy"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(VlctlError, match=r"img_emb_00000\.npy: .* bytes, but .*manifest.json records .*truncated"):
        open_gallery(tmp_path / "g")
    shard.write_bytes(data[:100])  # a header-only file, size check aside
    with pytest.raises(VlctlError, match="img_emb_00000.npy"):
        open_gallery(tmp_path / "g")
    shard.write_bytes(data)
    flipped = bytearray(data)
    flipped[-1] ^= 0xFF
    shard.write_bytes(bytes(flipped))
    with pytest.raises(VlctlError, match="sha256 differs"):
        open_gallery(tmp_path / "g").verify()
    shard.write_bytes(data)

    meta = tmp_path / "g" / "metadata" / "metadata_00000.parquet"
    meta_data = meta.read_bytes()
    meta.write_bytes(meta_data[:-1])  # truncated
    with pytest.raises(VlctlError, match=r"metadata_00000.parquet: .* bytes, but .* records .*truncated"):
        open_gallery(tmp_path / "g").metadata([3])
    meta.write_bytes(meta_data)

    (tmp_path / "g" / "manifest.json").rename(tmp_path / "manifest.bak")
    # Without its manifest a store is a clip-retrieval folder: read in place, its encoder unknown, never written.
    folder = open_gallery(tmp_path / "g")
    assert folder.read_only and not folder.encoder_known and folder.search(x[:1], k=1).ids[0, 0] == 0
    with pytest.raises(VlctlError, match=r"g: a clip-retrieval folder is read in place and never written"):
        folder.add(x[:1])
    (tmp_path / "g" / "img_emb").rename(tmp_path / "img_emb.bak")
    with pytest.raises(VlctlError, match=r"g/manifest.json: store manifest not found"):
        open_gallery(tmp_path / "g")
    (tmp_path / "img_emb.bak").rename(tmp_path / "g" / "img_emb")
    (tmp_path / "g" / "manifest.json").write_text("{not json")
    with pytest.raises(VlctlError, match="corrupt store manifest"):
        open_gallery(tmp_path / "g")
    (tmp_path / "g" / "manifest.json").write_text(json.dumps({"format": "x"}))
    with pytest.raises(VlctlError, match=r"missing field\(s\) \['encoder_id'"):
        open_gallery(tmp_path / "g")
    with pytest.raises(VlctlError, match="store directory not found"):
        open_gallery(tmp_path / "nope")
    with pytest.raises(VlctlError, match="IndexConfig.kind must be one of"):
        IndexConfig(kind="lsh")


@pytest.mark.parametrize("crash_in", ["write_index", "atomic_write_json"])
def test_crash_mid_add_leaves_previous_gallery(tmp_path, monkeypatch, crash_in):
    x = _clustered(300, 8)
    g = create_gallery(tmp_path / "g", ENC, 8, IndexConfig(kind="hnsw")).add(x[:200], [{"i": i} for i in range(200)])
    before = sorted(str(p.relative_to(tmp_path / "g")) for p in (tmp_path / "g").rglob("*") if p.is_file())

    module = parts_mod if crash_in == "write_index" else gallery_mod
    real = getattr(module, crash_in)

    def crash(*args, **kwargs):
        real(*args, **kwargs)  # the write itself completes; the process dies right after it
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(module, crash_in, crash)
    with pytest.raises(KeyboardInterrupt):
        g.add(x[200:], [{"i": i} for i in range(200, 300)])
    monkeypatch.undo()

    if crash_in == "write_index":  # crashed before the manifest rename: the old gallery stands
        again = open_gallery(tmp_path / "g")
        assert len(again) == 200 and again.search(x[:1], k=1).ids[0, 0] == 0
        again = again.add(x[200:], [{"i": i} for i in range(200, 300)])  # and the next add works
        assert len(again) == 300 and again.metadata([250]) == [{"i": 250}]
        after = sorted(str(p.relative_to(tmp_path / "g")) for p in (tmp_path / "g").rglob("*") if p.is_file())
        assert after == sorted(set(before) | {"img_emb/img_emb_00001.npy", "metadata/metadata_00001.parquet",
                                              "index/part_00001.faiss"})
    else:  # crashed after the rename: the new gallery is complete
        again = open_gallery(tmp_path / "g")
        assert len(again) == 300 and again.search(x[250:251], k=1).ids[0, 0] == 250
        again.verify()


# --------------------------------------------------------------------------------------------
# Extraction from files and the CLI


def _write_images(folder, n: int, seed: int = 0) -> list:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        p = folder / f"img{i:02d}.png"
        Image.fromarray(rng.integers(0, 256, (28 + i % 3, 30, 3), dtype=np.uint8)).save(p)
        paths.append(p)
    return paths


def _png_claiming_size(path, width: int, height: int) -> None:
    """A valid 1x1 PNG whose header claims width x height (a decompression bomb's header)."""
    import io
    import struct
    import zlib

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (1, 1)).save(buf, format="PNG")
    data = bytearray(buf.getvalue())
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", width, height)
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", zlib.crc32(bytes(data[ihdr : ihdr + 17])))
    path.write_bytes(bytes(data))


def test_embed_image_files_skips_bad_images(tmp_path):
    from vlctl.embeddings.extract import embed_image_files
    from vlctl.embeddings.extract_config import ExtractConfig
    from vlctl.images import ImageDecodeError, read_image

    enc = TinyCLIPEncoder(create_model("mad-quick", seed=0))
    good = _write_images(tmp_path, 9)
    (tmp_path / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    full = good[0].read_bytes()
    (tmp_path / "truncated.png").write_bytes(full[: len(full) // 2])
    _png_claiming_size(tmp_path / "bomb.png", 100_000, 100_000)
    paths = (
        good[:3]
        + [tmp_path / "corrupt.jpg"]
        + good[3:6]
        + [tmp_path / "truncated.png", tmp_path / "bomb.png"]
        + good[6:]
    )
    res = embed_image_files(enc, paths, ExtractConfig(batch_size=4), progress=False)
    assert res.ok.tolist() == [0, 1, 2, 4, 5, 6, 9, 10, 11]
    assert [p for p, _ in res.failures] == [str(tmp_path / n) for n in ("corrupt.jpg", "truncated.png", "bomb.png")]
    assert "cannot decode image" in res.failures[0][1] and "decompression bomb" in res.failures[2][1]
    # Each good image's row is exactly what the encoder gives it alone.
    ref = torch.cat([enc.encode_images(enc.preprocess(np.asarray(read_image(p)))[None]) for p in good]).numpy()
    assert np.allclose(res.embeddings, ref, atol=1e-6)
    with pytest.raises(ImageDecodeError, match=r"30 x 28 = 840 pixels exceeds the limit of 500"):
        read_image(good[0], max_pixels=500)
    # Between PIL's warning (1x) and error (2x MAX_IMAGE_PIXELS) thresholds: refused from the header.
    _png_claiming_size(tmp_path / "bomb2.png", 10_000, 10_000)
    with pytest.raises(ImageDecodeError, match=r"10000 x 10000 = 100000000 pixels exceeds the limit of 89478485"):
        read_image(tmp_path / "bomb2.png")
    again = embed_image_files(enc, paths, ExtractConfig(batch_size=5, workers=1), progress=False)
    assert np.array_equal(again.ok, res.ok) and np.allclose(again.embeddings, res.embeddings, atol=1e-6)


def _run_cli(argv, capsys):
    from vlctl.cli import main

    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 and "--json" in argv else out), err


def test_cli_index_and_search(tmp_path, capsys):
    from vlctl.encoders.tiny_pretrained import save_pretrained

    save_pretrained(create_model("mad-quick", seed=0), tmp_path / "model")
    save_pretrained(create_model("mad-quick", seed=1), tmp_path / "other")
    photos = tmp_path / "photos"
    paths = _write_images(photos / "a", 6)
    (photos / "a" / "broken.png").write_bytes(b"junk")
    (tmp_path / "labels.csv").write_text("filepath,caption,color\na/img00.png,red 3,red\na/img01.png,blue 7,blue\n")
    gal = tmp_path / "gallery"
    spec = f"tiny:{tmp_path / 'model'}"
    argv = [
        "index",
        str(photos),
        "--encoder",
        spec,
        "--out",
        str(gal),
        "--annotations",
        str(tmp_path / "labels.csv"),
        "--batch-size",
        "4",
        "--no-progress",
        "--json",
    ]
    rc, rep, _ = _run_cli(argv, capsys)
    assert rc == 0 and rep["added"] == 6 and rep["failed"] == 1 and rep["count"] == 6 and rep["index"] == "flat"
    assert rep["failures"][0][0] == str((photos / "a" / "broken.png").resolve())
    rc, rep, _ = _run_cli(argv, capsys)  # incremental: nothing new
    assert rc == 0 and rep["added"] == 0 and rep["already_present"] == 6
    _write_images(photos / "b", 2, seed=5)
    rc, rep, _ = _run_cli(argv, capsys)
    assert rc == 0 and rep["added"] == 2 and rep["count"] == 8

    rc, res, _ = _run_cli(["search", str(gal), "--image", str(paths[2]), "-k", "3", "--json"], capsys)
    assert (
        rc == 0
        and res["hits"][0]["path"] == str(paths[2].resolve())
        and res["hits"][0]["score"] == pytest.approx(1, abs=1e-5)
    )
    assert [h["rank"] for h in res["hits"]] == [1, 2, 3]
    rc, res, _ = _run_cli(["search", str(gal), "--text", "red 3", "-k", "8", "--json"], capsys)
    assert rc == 0 and len(res["hits"]) == 8
    by_path = {h["path"]: h for h in res["hits"]}
    assert by_path[str(paths[0].resolve())]["color"] == "red" and by_path[str(paths[0].resolve())]["captions"] == [
        "red 3"
    ]
    q = open_gallery(gal).vectors([5])
    np.save(tmp_path / "q.npy", q)  # (1, dim)
    rc, res, _ = _run_cli(["search", str(gal), "--embedding", str(tmp_path / "q.npy"), "-k", "1", "--json"], capsys)
    assert rc == 0 and res["hits"][0]["id"] == 5 and res["query"] == {"embedding": str(tmp_path / "q.npy")}
    np.save(tmp_path / "bad.npy", np.ones((2, 2, 2), np.float32))
    rc, _, err = _run_cli(["search", str(gal), "--embedding", str(tmp_path / "bad.npy")], capsys)
    assert rc == 2 and "expected one embedding of shape (dim,) or (1, dim), got (2, 2, 2)" in err
    rc, text, _ = _run_cli(["search", str(gal), "--text", "red 3", "-k", "2"], capsys)
    assert rc == 0 and len(text.strip().splitlines()) == 2

    rc, _, err = _run_cli(
        ["index", str(photos), "--encoder", f"tiny:{tmp_path / 'other'}", "--out", str(gal), "--no-progress"], capsys
    )
    assert rc == 2 and "store was built with encoder" in err
    rc, _, err = _run_cli(["search", str(gal), "--text", "x", "--encoder", f"tiny:{tmp_path / 'other'}"], capsys)
    assert rc == 2 and "store was built with encoder" in err
    rc, _, err = _run_cli(["index", str(photos), "--encoder", spec, "--out", str(gal), "--index-kind", "hnsw"], capsys)
    assert rc == 2 and "store uses index" in err
    rc, _, err = _run_cli(["search", str(tmp_path), "--text", "x"], capsys)
    assert rc == 2 and "manifest.json: store manifest not found" in err
    rc, _, err = _run_cli(["index", str(photos), "--encoder", "nope:x", "--out", str(tmp_path / "g2")], capsys)
    assert rc == 2 and "unknown encoder spec 'nope:x'" in err
    assert len(open_gallery(gal)) == 8  # every refusal left the gallery as it was


@pytest.mark.slow
def test_index_under_torchrun_equals_one_process(tmp_path, capsys):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from vlctl.encoders.tiny_pretrained import save_pretrained

    root = Path(__file__).resolve().parents[1]
    save_pretrained(create_model("mad-quick", seed=0), tmp_path / "model")
    photos = tmp_path / "photos"
    _write_images(photos, 7)
    (photos / "bad.png").write_bytes(b"junk")
    common = [str(photos), "--encoder", f"tiny:{tmp_path / 'model'}", "--batch-size", "2", "--no-progress", "--json"]
    rc, single, _ = _run_cli(["index", *common, "--out", str(tmp_path / "one")], capsys)
    assert rc == 0
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(root / "src"))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "vlctl",
           "index", *common, "--out", str(tmp_path / "two")]  # fmt: skip
    proc = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert report["world_size"] == 2 and report["added"] == single["added"] == 7 and report["failed"] == 1
    assert report["failures"][0][0] == single["failures"][0][0]
    one, two = open_gallery(tmp_path / "one"), open_gallery(tmp_path / "two")
    assert one.metadata() == two.metadata()
    assert np.allclose(one.embeddings(), two.embeddings(), atol=1e-6)
    assert not list(tmp_path.glob(".two.rank*"))  # the per-rank parts are cleaned up


def test_bad_row_mid_add_leaves_gallery_and_its_index_intact(tmp_path, monkeypatch):
    monkeypatch.setattr(table_mod, "ADD_CHUNK", 2)  # the add streams in chunks; fail in the third
    x = _clustered(40, 8)
    g = create_gallery(tmp_path / "g", ENC, 8, IndexConfig(kind="hnsw")).add(x[:20])
    before = g.search(x[:3], k=5)
    bad = x[20:].copy()
    bad[5] = np.nan
    with pytest.raises(VlctlError, match=r"add \(rows 4\.\.5\): embeddings contain NaN or inf"):
        g.add(bad)
    bad[5] = 0
    with pytest.raises(VlctlError, match=r"row 1 is all zeros"):
        g.add(bad)
    # The same object still answers as before (its half-updated in-memory index was dropped).
    after = g.search(x[:3], k=5)
    assert len(g) == 20 and np.array_equal(after.ids, before.ids) and np.allclose(after.scores, before.scores)
    assert sorted(str(p.relative_to(tmp_path / "g")) for p in (tmp_path / "g").rglob("*") if p.is_file()) == [
        "img_emb/img_emb_00000.npy", "index/part_00000.faiss", "manifest.json", "metadata/metadata_00000.parquet"
    ]  # fmt: skip
    g = g.add(x[20:])
    assert len(g) == 40 and g.search(x[30:31], k=1).ids[0, 0] == 30


def test_cli_search_by_image_and_attribute(tmp_path, capsys):
    """ControlEmbed query mode over a frozen gallery: the CLI's hits equal ControlEmbed.search."""
    from vlctl.embeddings.store import open_gallery
    from vlctl.encoders.tiny_pretrained import save_pretrained
    from vlctl.methods.controlembed.estimator import ControlEmbed

    save_pretrained(create_model("mad-quick", seed=0), tmp_path / "model")
    paths = _write_images(tmp_path / "photos", 12)
    gal = tmp_path / "gallery"
    rc, rep, _ = _run_cli(["index", str(tmp_path / "photos"), "--encoder", f"tiny:{tmp_path / 'model'}", "--out",
                           str(gal), "--no-progress", "--json"], capsys)
    assert rc == 0 and rep["count"] == 12
    g = open_gallery(gal)
    vecs = g.vectors(np.arange(12))
    labels = {"color": ["a", "b", "c"] * 4, "shape": ["x", "y"] * 6}
    model = ControlEmbed(steps=5, align_weight=0.0, images_per_subclass=2, hidden=16).fit(
        vecs, labels, encoder_id=g.encoder_id)
    model.save(tmp_path / "ce")
    rc, res, _ = _run_cli(["search", str(gal), "--image", str(paths[3]), "--attribute", "color", "--controlembed",
                           str(tmp_path / "ce"), "-k", "4", "--json"], capsys)
    assert rc == 0 and res["query"]["attribute"] == "color", res
    row = next(r for r in range(12) if g.metadata([r])[0]["path"] == str(paths[3].resolve()))
    want, _ = model.search(vecs[[row]], vecs, "color", k=4, encoder_id=g.encoder_id)
    assert [h["id"] for h in res["hits"]] == want[0].tolist()
    rc, _, err = _run_cli(["search", str(gal), "--image", str(paths[3]), "--attribute", "color"], capsys)
    assert rc == 2 and "--controlembed" in err


def test_store_opens_by_path_like_open_store(tmp_path):
    """`Store(path)` is `open_store(path)`: the same checks, the same rows."""
    from vlctl.embeddings.store import Store

    x = _clustered(10, 8)
    create_gallery(tmp_path / "g", ENC, 8).add(x)
    s = Store(tmp_path / "g")
    assert len(s) == 10 and np.allclose(s.vectors([3]), open_gallery(tmp_path / "g").vectors([3]))
    with pytest.raises(VlctlError, match="store directory not found"):
        Store(tmp_path / "nope")
