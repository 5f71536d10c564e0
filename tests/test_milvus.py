"""The Milvus backend, through Milvus Lite for real (an embedded Milvus in a local .db directory):
a collection filled from a store answers as the store's exact search does (text, image, embedding,
ControlEmbed attribute, TEVI rerank), fills resume, and another encoder's store is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vlctl.embeddings.milvus import MilvusConfig, fill, open_milvus, parse_backend
from vlctl.embeddings.results import exact_rerank
from vlctl.embeddings.store import create_store, open_store
from vlctl.fsops import VlctlError

pytestmark = pytest.mark.needs_milvus

EXACT = MilvusConfig(index="FLAT", batch=64)  # exact search: the same top k as the store's, to float rounding


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _store(path, n: int = 300, dim: int = 32, seed: int = 0, encoder: str = "enc@0"):
    x = _unit(np.random.default_rng(seed).standard_normal((n, dim)))
    meta = [{"path": f"img{i:04d}.jpg", "caption": f"image {i}"} for i in range(n)]
    return create_store(path, encoder, dim).add(x[: n // 2], meta[: n // 2]).add(x[n // 2 :], meta[n // 2 :])


def _same(a, b, atol: float = 1e-5) -> None:
    assert np.array_equal(a.ids, b.ids)
    assert np.allclose(a.scores, b.scores, atol=atol)


def test_backend_forms():
    assert parse_backend("milvus:http://db:19530").uri == "http://db:19530"
    assert parse_backend("milvus:db.example:19530#photos") == parse_backend("milvus:http://db.example:19530#photos")
    lite = parse_backend("milvus:x.db#c1")
    assert lite.lite and lite.collection == "c1" and lite.uri.endswith("/x.db")
    for bad, says in (("faiss:x.db", "expected milvus:PATH.db"), ("milvus:x.db#1bad", "collection name '1bad'"),
                      ("milvus:nowhere", "expected milvus:PATH.db"), ("milvus:/no/such/dir/x.db", "not found")):
        with pytest.raises(VlctlError, match=says):
            parse_backend(bad)


def test_fill_search_and_resume_equal_the_local_store(tmp_path):
    store = _store(tmp_path / "s")
    backend = f"milvus:{tmp_path / 'm.db'}"
    rep = fill(store, backend, EXACT, progress=False)
    assert (rep["added"], rep["already_present"], rep["count"], rep["index"]) == (300, 0, 300, "FLAT")
    coll = open_milvus(backend)
    assert len(coll) == 300 and coll.encoder_id == "enc@0" and coll.dim == 32
    q = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)
    _same(coll.search(q, k=10), store.search(q, k=10))
    got, want = coll.search(q, k=10).hits(coll), store.search(q, k=10).hits(store)
    assert [[{**h, "score": 0} for h in r] for r in got] == [[{**h, "score": 0} for h in r] for r in want]
    assert np.array_equal(coll.vectors([7, 3, 7]), store.vectors([7, 3, 7]))
    assert coll.metadata([5]) == [{"path": "img0005.jpg", "caption": "image 5"}]
    # More rows than the collection holds: padded as the store pads.
    _same(coll.search(q[0], k=400), store.search(q[0], k=400))
    # The reranker sees the fetched candidates' vectors: the store's exact rerank, the same order.
    _same(coll.search(q, k=5, reranker=exact_rerank, candidates=40),
          store.search(q, k=5, reranker=exact_rerank, candidates=40))

    # Resume: a rerun adds nothing; rows the store gained since, and rows the collection lost, are
    # added, each once.
    assert fill(store, backend, progress=False)["added"] == 0
    store = store.add(_unit(np.random.default_rng(2).standard_normal((50, 32))), [{"path": "new"}] * 50)
    coll.client.delete(coll.backend.collection, ids=[0, 101, 102, 299])
    rep = fill(store, backend, progress=False)
    assert (rep["added"], rep["already_present"], rep["count"]) == (54, 296, 350)
    coll.client.delete(coll.backend.collection, ids=[200, 349])  # past a held prefix of whole batches
    assert fill(store, backend, progress=False)["added"] == 2
    coll = open_milvus(backend)
    assert len(coll) == 350
    ids = [r["id"] for r in coll.client.query(coll.backend.collection, filter="id >= 0", output_fields=["id"])]
    assert sorted(ids) == list(range(350))
    _same(coll.search(q, k=10), store.search(q, k=10))


def test_refuses_another_encoder_another_store_and_other_collections(tmp_path):
    backend = f"milvus:{tmp_path / 'm.db'}#photos"
    store = _store(tmp_path / "s", n=40)
    fill(store, backend, EXACT, progress=False)
    with pytest.raises(VlctlError, match=r"holds embeddings of encoder 'enc@0' \(dim 32\), the store .* 'enc@1'"):
        fill(_store(tmp_path / "other-encoder", n=40, encoder="enc@1"), backend, progress=False)
    with pytest.raises(VlctlError, match="filled from another store"):
        fill(_store(tmp_path / "other-rows", n=40, seed=5), backend, progress=False)
    with pytest.raises(VlctlError, match=r"uses \{'index': 'FLAT'"):
        fill(store, backend, MilvusConfig(index="HNSW"), progress=False)
    with pytest.raises(VlctlError, match="collection was filled with embeddings of encoder 'enc@0', not 'enc@1'"):
        open_milvus(backend).check_encoder("enc@1")
    with pytest.raises(VlctlError, match="no such collection"):
        open_milvus(f"milvus:{tmp_path / 'm.db'}#absent")
    # A collection vlctl did not write is refused, and left as it is.
    client = open_milvus(backend).client
    client.create_collection("theirs", dimension=32)
    with pytest.raises(VlctlError, match="was not written by this vlctl"):
        fill(store, f"milvus:{tmp_path / 'm.db'}#theirs", progress=False)
    assert "theirs" in client.list_collections()
    assert len(open_milvus(backend)) == 40


def test_hnsw_finds_the_exact_neighbours(tmp_path):
    """The default index (HNSW, IP) on a small store: the exact top 10 of every query."""
    store = _store(tmp_path / "s", n=2000, dim=16)
    fill(store, f"milvus:{tmp_path / 'm.db'}", progress=False)
    q = np.random.default_rng(3).standard_normal((20, 16)).astype(np.float32)
    _same(open_milvus(f"milvus:{tmp_path / 'm.db'}").search(q, k=10), store.search(q, k=10))


# --- the command line ---------------------------------------------------------------------------


def _run(argv, capsys):
    from vlctl.cli import main

    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 and "--json" in argv else out), err


@pytest.fixture(scope="module")
def gallery(tmp_path_factory):
    """A TinyCLIP store of 12 images with captions, its Milvus Lite collection, a ControlEmbed and a TEVI."""
    from PIL import Image

    from vlctl.cli import main
    from vlctl.encoders.tiny_model import create_model
    from vlctl.encoders.tiny_pretrained import save_pretrained
    from vlctl.methods.controlembed.estimator import ControlEmbed
    from vlctl.methods.sae.model import SparseAutoencoder
    from vlctl.methods.tevi.estimator import TEVI

    root = tmp_path_factory.mktemp("milvus")
    save_pretrained(create_model("mad-quick", seed=0), root / "model")
    rng = np.random.default_rng(0)
    (root / "photos").mkdir()
    for i in range(12):
        Image.fromarray(rng.integers(0, 256, (28, 30, 3), dtype=np.uint8)).save(root / "photos" / f"img{i:02d}.png")
    assert main(["index", str(root / "photos"), "--encoder", f"tiny:{root / 'model'}", "--out", str(root / "store"),
                 "--no-progress"]) == 0
    store = open_store(root / "store")
    vecs = store.vectors(np.arange(12))
    ControlEmbed(steps=5, align_weight=0.0, images_per_subclass=2, hidden=16).fit(
        vecs, {"color": ["a", "b", "c"] * 4}, encoder_id=store.encoder_id).save(root / "ce")
    sae = SparseAutoencoder(d_latent=32, k=4, epochs=1).fit(vecs, encoder_id=store.encoder_id)
    TEVI(epochs=1).fit(vecs, _unit(vecs + 0.3 * rng.standard_normal(vecs.shape)), sae=sae).save(root / "tevi")
    return root


def _same_ranking(got: list[dict], every: list[dict]) -> None:
    """`got` (the top hits) has the scores of the first hits of `every` (all rows, ranked), rank by
    rank, and each hit is that row's hit in `every`: the same ranking up to the order of rows whose
    scores tie to float rounding (a random-weights encoder's images are nearly alike)."""
    assert [h["score"] for h in got] == pytest.approx([h["score"] for h in every[: len(got)]], abs=1e-5)
    by_id = {h["id"]: h for h in every}
    for h in got:
        want = by_id[h["id"]]
        assert {**h, "score": 0, "rank": 0} == {**want, "score": 0, "rank": 0}
        assert h["score"] == pytest.approx(want["score"], abs=1e-5)


def test_cli_fill_and_search_equal_the_store(gallery, capsys):
    db = f"milvus:{gallery / 'c.db'}"
    argv = ["index", str(gallery / "store"), "--backend", db, "--milvus-index", "FLAT", "--no-progress", "--json"]
    rc, rep, _ = _run(argv, capsys)
    assert rc == 0 and (rep["added"], rep["count"]) == (12, 12)
    rc, rep, _ = _run(argv, capsys)
    assert rc == 0 and (rep["added"], rep["already_present"]) == (0, 12)
    image = gallery / "photos" / "img03.png"
    np.save(gallery / "q.npy", open_store(gallery / "store").vectors([5]))
    queries = (["--text", "red 3"], ["--image", str(image)], ["--embedding", str(gallery / "q.npy")],
               ["--image", str(image), "--attribute", "color", "--controlembed", str(gallery / "ce")],
               ["--text", "red 3", "--rerank", f"tevi:{gallery / 'tevi'}", "--alpha", "0.5",
                "--rerank-candidates", "8"])
    for query in queries:
        rc, local, _ = _run(["search", str(gallery / "store"), *query, "-k", "12", "--json"], capsys)
        assert rc == 0, query
        rc, remote, _ = _run(["search", "--backend", db, *query, "-k", "6", "--json"], capsys)
        assert rc == 0, query
        _same_ranking(remote["hits"], local["hits"])
        assert remote["query"] == local["query"] and remote["store"] == f"{db}#vlctl"


def test_cli_refusals_are_one_line(gallery, tmp_path, capsys):
    from vlctl.encoders.tiny_model import create_model
    from vlctl.encoders.tiny_pretrained import save_pretrained

    db = f"milvus:{gallery / 'r.db'}"
    assert _run(["index", str(gallery / "store"), "--backend", db, "--no-progress"], capsys)[0] == 0
    other = create_store(tmp_path / "other", "tiny:other@0", 8).add(_unit(np.ones((3, 8))))
    rc, _, err = _run(["index", str(other.path), "--backend", db, "--no-progress"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "holds embeddings of encoder" in err and "Traceback" not in err
    save_pretrained(create_model("mad-quick", seed=1), tmp_path / "other-model")
    rc, _, err = _run(["search", "--backend", db, "--text", "x", "--encoder", f"tiny:{tmp_path / 'other-model'}"],
                      capsys)
    assert rc == 2 and err.count("\n") == 1 and "collection was filled with embeddings of encoder" in err
    for argv, says in ((["search", "--text", "x"], "give a STORE directory or --backend"),
                       (["search", str(gallery / "store"), "--backend", db, "--text", "x"], "one of them"),
                       (["search", "--backend", "milvus:nowhere", "--text", "x"], "expected milvus:PATH.db"),
                       (["search", "--backend", f"{db}#absent", "--text", "x"], "no such collection"),
                       (["index", str(gallery / "photos")], "the following arguments are required: --encoder, --out"),
                       (["index", str(gallery / "store"), "--backend", db, "--out", str(tmp_path / "x")],
                        "--encoder and --out go with images")):
        rc, _, err = _run(argv, capsys)
        assert rc == 2 and says in err and err.count("\n") == 1, (argv, err)


def test_serve_searches_the_collection(gallery):
    from fastapi.testclient import TestClient

    from vlctl.serve.app import create_app
    from vlctl.serve.config import ServeConfig
    from vlctl.serve.state import state_for_store

    db = f"milvus:{gallery / 's.db'}"
    fill(open_store(gallery / "store"), db, EXACT, progress=False)
    models = {"controlembed": gallery / "ce", "tevi": gallery / "tevi"}
    state = state_for_store(None, backend=db, **models)
    local = state_for_store(gallery / "store", **models)
    with TestClient(create_app(state, ServeConfig())) as client, TestClient(create_app(local, ServeConfig())) as ref:
        for path, body in (("search", {"text": "red 3", "k": 5}), ("search", {"image_id": 4, "k": 5}),
                           ("steer", {"image_id": 4, "attribute": "color", "k": 5}),
                           ("steer", {"text": "red 3", "tevi": True, "candidates": 8, "k": 5})):
            got = client.post(f"/api/{path}", json={"collection": "vlctl", **body})
            want = ref.post(f"/api/{path}", json={"collection": "store", **body, "k": 12})
            assert got.status_code == want.status_code == 200, got.text
            hits = got.json()["hits"]
            assert len(hits) == 5
            _same_ranking([{"id": h["id"], "score": h["score"]} for h in hits],
                          [{"id": h["id"], "score": h["score"]} for h in want.json()["hits"]])
