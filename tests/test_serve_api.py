"""`vlctl serve`: the JSON API through httpx (FastAPI's TestClient) on a tiny store built here.

The world: 24 PNGs of coloured squares (3 colours x 2 sizes, with pixel noise) and their captions,
indexed by `vlctl index` with a small random TinyCLIP (so the store names its files, the path
`vlctl serve STORE` takes); a ControlEmbed fitted on the stored vectors with given category
embeddings (color, size); an SAE and TEVI on the image-caption pairs; a second TinyCLIP as the
"tuned" model of Explain. Every answer is checked against the library computing the same thing.
`build_world` is shared with the browser and fuzz tests.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

COLORS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}
COND = {"color": np.array([1.0, 0.0, 0.0, 0.0]), "size": np.array([0.0, 1.0, 0.0, 0.0])}
VOCAB = ("a", "red", "green", "blue", "big", "small", "square", "or", "and")
N = 24


def build_world(root: Path) -> dict:
    """The files of the test world under `root` (see the module docstring) -> their paths."""
    from vlctl.cli import main
    from vlctl.embeddings.store import open_store
    from vlctl.encoders.factory import create
    from vlctl.encoders.tiny_config import TinyCLIPConfig
    from vlctl.encoders.tiny_model import create_model
    from vlctl.encoders.tiny_pretrained import save_pretrained
    from vlctl.methods.controlembed.estimator import ControlEmbed
    from vlctl.methods.sae.model import SparseAutoencoder
    from vlctl.methods.tevi.estimator import TEVI

    cfg = TinyCLIPConfig(name="serve-test", image_size=32, patch_size=8, vision_width=32, vision_layers=2,
                         vision_heads=2, text_width=32, text_layers=1, text_heads=2, context_length=16, vocab=VOCAB,
                         embed_dim=16)
    save_pretrained(create_model(cfg, seed=0), root / "model")
    save_pretrained(create_model(cfg, seed=1), root / "tuned")
    rng = np.random.default_rng(0)
    photos = root / "photos"
    photos.mkdir()
    rows = []
    for i in range(N):
        color, big = list(COLORS)[i % 3], (i // 3) % 2 == 0
        a = np.full((40, 40, 3), 245, np.uint8)
        r = 14 if big else 6
        a[20 - r: 20 + r, 20 - r: 20 + r] = COLORS[color]
        a = np.clip(a.astype(int) + rng.integers(-12, 12, a.shape), 0, 255).astype(np.uint8)
        Image.fromarray(a).save(photos / f"img{i:02d}.png")
        rows.append({"filepath": f"img{i:02d}.png", "caption": f"a {'big' if big else 'small'} {color} square",
                     "color": color, "size": "big" if big else "small"})
    with open(root / "labels.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    store_dir = root / "store"
    assert main(["index", str(photos), "--annotations", str(root / "labels.csv"), "--encoder",
                 f"tiny:{root / 'model'}", "--out", str(store_dir), "--no-progress", "--json"]) == 0
    store = open_store(store_dir)
    meta = store.metadata()
    labels = {c: [m[c] for m in meta] for c in ("color", "size")}
    enc = create(f"tiny:{root / 'model'}")
    text = {c: enc.embed_texts(sorted(set(labels[c]))) for c in ("color", "size")}
    ControlEmbed(steps=30, align_weight=0.0, images_per_subclass=2, hidden=16, seed=0).fit(
        store.embeddings(), labels, encoder_id=store.encoder_id, category_emb=COND, class_text_emb=text
    ).save(root / "ce")
    img, txt = store.pairs()
    torch.manual_seed(0)
    sae = SparseAutoencoder(k=4, expansion=2, aux_k=0, epochs=5, batch_size=64, lr=1e-2, init_b_pre="zeros",
                            seed=0).fit(img, store.encoder_id)
    TEVI(hidden=16, epochs=2, batch_size=64, seed=0).fit(img, txt, sae=sae).save(root / "tevi")
    return {"root": root, "store": store_dir, "ce": root / "ce", "tevi": root / "tevi", "tuned": root / "tuned",
            "model": root / "model", "photos": photos, "rows": rows}


def world_state(world: dict, trees: bool = False):
    from vlctl.serve.state import state_for_store

    state = state_for_store(world["store"], controlembed=world["ce"], tevi=world["tevi"], tuned=world["tuned"])
    if not trees:
        state.explain.trees = None  # spaCy and WordNet load in seconds; one test checks the trees
    return state


_WORLD: dict = {}


def shared_world(tmp_path_factory) -> dict:
    """One world per test session (the browser and fuzz tests import this module)."""
    if "world" not in _WORLD:
        _WORLD["world"] = build_world(tmp_path_factory.mktemp("serve"))
    return _WORLD["world"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return shared_world(tmp_path_factory)


@pytest.fixture(scope="module")
def state(world):
    return world_state(world, trees=True)


@pytest.fixture(scope="module")
def client(state):
    from fastapi.testclient import TestClient

    from vlctl.serve.app import create_app
    from vlctl.serve.config import ServeConfig

    with TestClient(create_app(state, ServeConfig(max_pixels=100_000, max_upload_bytes=200_000))) as c:
        yield c


def _error(r, status: int) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and isinstance(body["error"], str) and "\n" not in body["error"]
    return body["error"]


# --- search --------------------------------------------------------------------------------------


def test_info_lists_what_is_served(client, state):
    info = client.get("/api/info").json()
    (coll,) = info["collections"]
    assert coll["name"] == "store" and coll["size"] == N and coll["thumbnails"] and coll["tevi"]
    assert coll["attributes"] == ["color", "size"] and not coll["free_text_attributes"]
    assert coll["subclasses"] == {"color": ["blue", "green", "red"], "size": ["big", "small"]}
    assert info["explain"]["models"] == ["base", "tuned"] and info["explain"]["size"] == N
    assert info["explain"]["examples"][0]["caption"] == state.explain.caption(0)
    assert info["limits"]["max_pixels"] == 100_000


def test_text_search_matches_the_store(client, state):
    coll = state.collections["store"]
    from vlctl.serve import schemas

    r = client.post("/api/search", json={"collection": "store", "text": "a red square", "k": 5})
    assert r.status_code == 200
    schemas.SearchResponse.model_validate(r.json())  # answered without FastAPI's check: it still is the model
    want = coll.store.search(coll.encoder.embed_texts(["a red square"]), k=5)
    hits = r.json()["hits"]
    assert [h["id"] for h in hits] == want.ids[0].tolist()
    np.testing.assert_allclose([h["score"] for h in hits], want.scores[0], rtol=1e-5)
    meta = coll.store.metadata(want.ids[0])
    assert [h["label"] for h in hits] == [m["captions"][0] if "captions" in m else m["caption"] for m in meta]
    # issue 43: each image is named by its file (the page shows the name, the path on hover)
    assert [h["path"] for h in hits] == [m["path"] for m in meta]
    assert [h["file"] for h in hits] == [Path(m["path"]).name for m in meta] and hits[0]["file"].startswith("img")
    by_image = client.post("/api/search", json={"collection": "store", "image_id": 7, "k": 1}).json()
    assert by_image["query"] == {"image_id": 7, "file": "img07.png", "path": meta_path(coll, 7)}


def meta_path(coll, row: int) -> str:
    return coll.store.metadata([row])[0]["path"]


def test_text_queries_of_concurrent_requests_share_a_forward(state, monkeypatch):
    import asyncio

    from vlctl.fsops import VlctlError
    from vlctl.serve.texts import TextBatches

    coll = state.collections["store"]
    real = coll.encoder.embed_texts
    calls, started, gate = [], threading.Event(), threading.Event()

    def embed(texts):
        calls.append(list(texts))
        started.set()
        gate.wait(10)  # the first forward runs while the other requests queue their texts
        if "refused" in texts:
            raise VlctlError("embed_texts: item 0: the tokenizer refuses it")
        return real(texts)

    monkeypatch.setattr(coll.encoder, "embed_texts", embed)
    from vlctl.serve.state import _LRU

    monkeypatch.setattr(coll, "text_queries", _LRU(64))  # none of these texts cached by an earlier test
    batches = TextBatches()

    async def main():
        first = asyncio.create_task(batches.cache(coll, "a big red square"))
        while not started.is_set():
            await asyncio.sleep(0.01)
        rest = [asyncio.create_task(batches.cache(coll, t)) for t in ("a red square", "a blue square", "refused",
                                                                       "a red square")]
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.gather(first, *rest)

    asyncio.run(main())
    batches.shutdown()
    # one forward for everything queued behind the first; a refused text then fails alone
    assert calls[:2] == [["a big red square"], ["a red square", "a blue square", "refused"]]
    assert calls[2:] == [["a red square"], ["a blue square"], ["refused"]]
    for text in ("a big red square", "a red square", "a blue square"):
        np.testing.assert_allclose(coll.text_queries.get(text), real([text]), atol=1e-6)
    assert coll.text_queries.get("refused") is None
    with pytest.raises(VlctlError, match="refuses"):
        coll.text_query("refused")  # its own request reports it


def test_text_queries_are_encoded_once(client, state, monkeypatch):
    coll = state.collections["store"]
    calls = []
    real = coll.encoder.embed_texts
    monkeypatch.setattr(coll.encoder, "embed_texts", lambda texts: calls.append(list(texts)) or real(texts))
    first = client.post("/api/search", json={"collection": "store", "text": "a big blue square", "k": 5}).json()
    again = client.post("/api/search", json={"collection": "store", "text": "a big blue square", "k": 5}).json()
    assert first == again and calls == [["a big blue square"]]  # the second answer came from the cache
    q = coll.text_query("a big blue square")
    assert not q.flags.writeable  # shared by every request for the text: nobody may change it in place
    np.testing.assert_array_equal(q, real(["a big blue square"]))
    client.post("/api/steer", json={"collection": "store", "text": "a big blue square", "tevi": True, "k": 5})
    assert calls.count(["a big blue square"]) == 1  # (the steer embeds the latents' names once, too)
    from vlctl.serve.state import _LRU

    off = _LRU(0)  # --text-cache 0: nothing is kept
    off.put("a big blue square", q)
    assert off.get("a big blue square") is None


def test_search_by_a_stored_image_uses_its_stored_vector(client, state):
    coll = state.collections["store"]
    hits = client.post("/api/search", json={"collection": "store", "image_id": 7, "k": 3}).json()["hits"]
    want = coll.store.search(coll.store.vectors([7]), k=3)
    assert [h["id"] for h in hits] == want.ids[0].tolist() and 7 in want.ids[0]
    assert hits[0]["score"] == pytest.approx(1.0, abs=1e-4)  # itself (or a twin as close)


def test_upload_is_typed_by_its_bytes_and_limited(client, state, world):
    coll = state.collections["store"]
    png = (world["photos"] / "img04.png").read_bytes()
    # A PNG sent as "photo.jpg" with image/jpeg: the bytes decide, and it searches like the file itself.
    r = client.post("/api/search/upload", files={"file": ("photo.jpg", png, "image/jpeg")},
                    data={"collection": "store", "k": "4"})
    assert r.status_code == 200, r.text
    want = coll.store.search(coll.encoder.embed_images([np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))]), k=4)
    assert [h["id"] for h in r.json()["hits"]] == want.ids[0].tolist()
    assert "not an image" in _error(client.post("/api/search/upload", files={"file": ("x.png", b"GIF8 not", "image/png")},
                                            data={"collection": "store"}), 415)
    assert "cannot decode" in _error(client.post("/api/search/upload",
                                                 files={"file": ("x.png", png[:40], "image/png")},
                                                 data={"collection": "store"}), 400)
    big = io.BytesIO()
    Image.new("RGB", (400, 300)).save(big, format="PNG")  # 120,000 pixels > 100,000: refused from the header
    assert "exceeds the limit of 100000" in _error(client.post(
        "/api/search/upload", files={"file": ("b.png", big.getvalue(), "image/png")}, data={"collection": "store"}), 413)
    huge = b"\x89PNG\r\n\x1a\n" + bytes(300_000)
    assert "200000 bytes" in _error(client.post("/api/search/upload", files={"file": ("h.png", huge, "image/png")},
                                                data={"collection": "store"}), 413)


def test_bad_requests_are_one_clear_message(client):
    assert _error(client.post("/api/search", json={"collection": "store", "text": "a", "k": 0}), 422).startswith("k:")
    assert "exactly one" in _error(client.post("/api/search", json={"collection": "store", "text": "a",
                                                                    "image_id": 1}), 422)
    assert "extra" in _error(client.post("/api/search", json={"collection": "store", "text": "a", "x": 1}), 422).lower()
    assert "no collection 'other'" in _error(client.post("/api/search", json={"collection": "other", "text": "a"}), 404)
    assert "no image 24" in _error(client.post("/api/search", json={"collection": "store", "image_id": 24}), 404)
    assert "unknown word 'purple'" in _error(client.post("/api/search", json={"collection": "store",
                                                                              "text": "a purple square"}), 400)
    assert _error(client.post("/api/search", content=b"{not json", headers={"content-type": "application/json"}), 422)
    assert "attribute" in _error(client.post("/api/steer", json={"collection": "store", "image_id": 0,
                                                                 "attribute": "../etc"}), 422)
    _error(client.get("/api/nothing"), 404)


# --- steer ---------------------------------------------------------------------------------------


def _steered(coll, row: int, a: str, b: str | None = None, alpha: float = 1.0, k: int = 8):
    from vlctl.methods.controlembed.estimator import normalize_rows

    q = normalize_rows(coll.store.vectors([row]))
    wa, ba = coll.controlembed.affine(a)
    x = q @ wa + ba
    if b is not None:
        wb, bb = coll.controlembed.affine(b)
        x = alpha * x + (1 - alpha) * (q @ wb + bb)
    return coll.store.search(x, k=k)


def test_steer_by_attribute_and_blend(client, state):
    from vlctl.serve import schemas

    coll = state.collections["store"]
    orders = {}
    for a in ("color", "size"):
        r = client.post("/api/steer", json={"collection": "store", "image_id": 3, "attribute": a, "k": 8}).json()
        want = _steered(coll, 3, a)
        schemas.SteerResponse.model_validate(r)
        assert r["mode"] == "attribute" and [h["id"] for h in r["hits"]] == want.ids[0].tolist()
        np.testing.assert_allclose([h["score"] for h in r["hits"]], want.scores[0], rtol=1e-4, atol=1e-6)
        orders[a] = [h["id"] for h in r["hits"]]
    assert orders["color"] != orders["size"]  # the same query re-ranks by the other attribute
    half = client.post("/api/steer", json={"collection": "store", "image_id": 3, "attribute": "color",
                                           "attribute_b": "size", "alpha": 0.25, "k": 8}).json()
    assert half["mode"] == "compose" and [h["id"] for h in half["hits"]] == _steered(coll, 3, "color", "size",
                                                                                      0.25).ids[0].tolist()
    full = client.post("/api/steer", json={"collection": "store", "image_id": 3, "attribute": "size",
                                           "attribute_b": "color", "alpha": 1.0, "k": 8}).json()
    assert [h["id"] for h in full["hits"]] == orders["size"]
    # issue 43: words, not a Python list
    assert "knows only color, size (" in _error(client.post("/api/steer", json={
        "collection": "store", "image_id": 3, "attribute": "hue"}), 400)


def test_tevi_rerank_marks_what_moved(client, state):
    coll = state.collections["store"]
    r = client.post("/api/steer", json={"collection": "store", "text": "a small blue square", "tevi": True,
                                        "candidates": 20, "k": 10})
    assert r.status_code == 200, r.text
    r = r.json()
    q = coll.encoder.embed_texts(["a small blue square"])
    base = coll.store.search(q, k=20)
    rescored = coll.tevi.store_reranker()(q, base.ids, coll.store)[0]  # without the precomputed codes
    order = np.argsort(-rescored, kind="stable")[:10]
    assert r["mode"] == "tevi" and [h["id"] for h in r["hits"]] == base.ids[0][order].tolist()
    np.testing.assert_allclose([h["score"] for h in r["hits"]], rescored[order], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose([h["before_score"] for h in r["hits"]], base.scores[0][order], rtol=1e-5)
    assert [h["before_rank"] for h in r["hits"]] == (order + 1).tolist()
    # moved: off one longest run of results still in their cosine order (issue 43: not all of them)
    stayed = [h["before_rank"] for h in r["hits"] if not h["moved"]]
    assert stayed == sorted(stayed) and len(stayed) == _longest_increasing(order.tolist())
    # issue 46: each result's active latents the caption's mask kept and dropped, named as --explain names them
    from vlctl.methods.sae.describe import decoder_names
    from vlctl.methods.tevi.explain import explain_results

    [want] = explain_results(coll.tevi, coll.store, q, [[h["id"] for h in r["hits"]]], top=4)
    assert [{"kept": h["kept"], "dropped": h["dropped"]} for h in r["hits"]] == want
    names = decoder_names(coll.tevi.sae_.model_, coll.store)
    assert all(x["name"] == names[x["latent"]] for h in r["hits"] for x in h["kept"] + h["dropped"])
    assert any(h["kept"] for h in r["hits"]) and all(x["mask"] >= 0.5 for h in r["hits"] for x in h["kept"])
    assert "text" in _error(client.post("/api/steer", json={"collection": "store", "image_id": 1, "tevi": True}), 422)


def _longest_increasing(seq: list[int]) -> int:
    best = [1] * len(seq)  # O(n^2) reference
    for i in range(len(seq)):
        for j in range(i):
            if seq[j] < seq[i]:
                best[i] = max(best[i], best[j] + 1)
    return max(best, default=0)


def test_moved_is_the_fewest_results_that_moved():
    """Issue 43: "24 of 24 moved" marked every result that a jump pushed down one place. A result
    moved when it is off the longest run still in cosine order: one jump is one move."""
    from vlctl.serve.work import moved

    assert moved([30, 1, 2, 3, 4]) == [True, False, False, False, False]  # #30 rose to the top: it alone moved
    assert moved([1, 2, 3]) == [False, False, False] and moved([]) == []
    assert moved([2, 1]) == [True, False]  # a swap: the one that rose
    assert moved([1, 5, 2, 3, 4]) == [False, True, False, False, False]
    rng = np.random.default_rng(0)
    for _ in range(50):
        before = rng.permutation(40)[:12].tolist()
        m = moved(before)
        stayed = [b for b, x in zip(before, m) if not x]
        assert stayed == sorted(stayed) and len(stayed) == _longest_increasing(before)


# --- clusters ------------------------------------------------------------------------------------


def _wait(client, job: dict) -> dict:
    for _ in range(400):
        if job["status"] in ("done", "failed"):
            return job
        time.sleep(0.05)
        job = client.get(f"/api/jobs/{job['id']}").json()
    raise AssertionError("job did not finish")


def test_cluster_job_matches_controlembed(client, state):
    from vlctl.methods.controlembed.estimator import normalize_rows

    coll = state.collections["store"]
    r = client.post("/api/cluster", json={"collection": "store", "attribute": "color", "per_cluster": 4})
    assert r.status_code == 202 and r.json()["status"] in ("queued", "running", "done")
    job = _wait(client, r.json())
    assert job["status"] == "done", job
    res = job["result"]
    emb = coll.store.embeddings()
    want = coll.controlembed.cluster(emb, "color", seed=0)
    z = normalize_rows(coll.controlembed.transform(emb, "color"))
    assert res["k"] == 3 and res["n_images"] == N and sum(c["size"] for c in res["clusters"]) == N
    for c in res["clusters"]:
        members = np.flatnonzero(want == c["id"])
        assert c["size"] == len(members)
        centre = z[members].mean(0)
        assert c["nearest"] == members[np.argsort(np.linalg.norm(z[members] - centre, axis=1), kind="stable")[:4]].tolist()
        assert [h["id"] for h in c["images"]] == c["nearest"]
        assert [h["file"] for h in c["images"]] == [f"img{i:02d}.png" for i in c["nearest"]]
    # the names: each subclass once, the assignment of largest total cosine with the centres
    from scipy.optimize import linear_sum_assignment

    centres = np.stack([z[want == c["id"]].mean(0) for c in res["clusters"]])
    sims = (centres / np.linalg.norm(centres, axis=1, keepdims=True)) @ coll.controlembed.class_text_emb_["color"].T
    rows, cols = linear_sum_assignment(sims, maximize=True)
    assert [res["clusters"][r]["subclass"] for r in rows] == [["blue", "green", "red"][c] for c in cols]
    again = client.post("/api/cluster", json={"collection": "store", "attribute": "color", "per_cluster": 4}).json()
    assert again["id"] == job["id"] and again["status"] == "done"  # the same work is not started twice
    assert "larger than" in _wait(client, client.post("/api/cluster", json={
        "collection": "store", "attribute": "size", "k": 30}).json())["error"]
    assert "no job" in _error(client.get("/api/jobs/0123456789abcdef"), 404)
    _error(client.get("/api/jobs/..%2F..%2Fetc"), 404)


def test_cluster_names_are_distinct(client):
    """Issue 43: two clusters were both named after the same subclass; each subclass names one
    cluster, and clusters beyond the subclasses are numbered."""
    from vlctl.serve.work import cluster_names

    for attribute, k in (("color", 2), ("size", 3), ("size", 2)):
        job = _wait(client, client.post("/api/cluster", json={"collection": "store", "attribute": attribute, "k": k,
                                                               "seed": 3}).json())
        names = [c["subclass"] for c in job["result"]["clusters"]]
        assert len(set(names)) == len(names) == k, names
    sims = np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.6]])
    assert cluster_names(sims, ["red", "blue"]) == ["red", "red (2)", "blue"]
    assert cluster_names(sims[:2], ["red", "blue"]) == ["red", "blue"]


def test_jobs_queue_is_bounded():
    import threading

    from vlctl.serve.jobs import Jobs, TooManyJobs

    gate = threading.Event()
    jobs = Jobs(workers=1, max_pending=2)
    jobs.submit(gate.wait)
    jobs.submit(gate.wait)
    with pytest.raises(TooManyJobs):
        jobs.submit(gate.wait)
    gate.set()
    jobs.shutdown()


# --- explain -------------------------------------------------------------------------------------


def test_explain_two_models_with_shared_scales_and_tree(client, state):
    from vlctl.methods.threevl.explain import explain_maps
    from vlctl.report.overlays import ColourScale

    es = state.explain
    caption = es.caption(0)
    r = client.post("/api/explain", json={"image_id": 0, "positive": caption, "negative": "a small green square"})
    assert r.status_code == 200, r.text
    r = r.json()
    assert [m["model"] for m in r["models"]] == ["base", "tuned"]
    image = es.pixels(0)
    refs = {name: explain_maps(enc, image, caption, "a small green square") for name, enc in es.models.items()}
    seq = ColourScale.sequential([ref["maps"][m] for ref in refs.values()
                                  for m in ("hilacam_positive", "hilacam_negative", "anchor")], "")
    div = ColourScale.diverging([ref["maps"]["dire"] for ref in refs.values()], "")
    bars = {b["method"]: b for b in r["colour_bars"]}
    assert bars["hilacam"]["vmin"] == pytest.approx(seq.vmin, rel=1e-5) and bars["dire"]["vmax"] == pytest.approx(div.vmax)
    for m in r["models"]:
        ref = refs[m["model"]]
        assert m["positive_score"] == pytest.approx(ref["positive_score"], abs=1e-5)
        assert m["anchor_text"] == ref["anchor_text"]
        assert [h["method"] for h in m["heatmaps"]] == ["hilacam_positive", "hilacam_negative", "anchor", "dire"]
        for h in m["heatmaps"]:
            png = Image.open(io.BytesIO(__import__("base64").b64decode(h["image"].split(",", 1)[1])))
            assert png.size == (256, 256)
        assert m["tree"], r["tree_note"]
        enc = es.models[m["model"]]
        lv = m["tree"][0]
        img = enc.embed_images([image])[0]  # square images: the letterboxed input is the image itself
        s = enc.embed_texts([lv["positive"], *lv["negatives"]]) @ img
        assert lv["positive_score"] == pytest.approx(float(s[0]), abs=1e-5)
        np.testing.assert_allclose(lv["negative_scores"], s[1:], atol=1e-5)
        assert lv["fails"] == [bool(v >= s[0]) for v in s[1:]]
    one = client.post("/api/explain", json={"image_id": 1, "positive": es.caption(1), "tree": False}).json()
    assert [len(m["heatmaps"]) for m in one["models"]] == [1, 1] and one["models"][0]["tree"] is None
    assert "no image 99" in _error(client.post("/api/explain", json={"image_id": 99, "positive": "a"}), 404)


def test_explain_an_uploaded_image(client, state, world):
    png = (world["photos"] / "img00.png").read_bytes()  # row 0's file: the upload explains the same pixels
    caption = state.explain.caption(0)
    r = client.post("/api/explain/upload", files={"file": ("mine.jpg", png, "image/jpeg")},
                    data={"positive": caption, "negative": "a small green square", "tree": "false"})
    assert r.status_code == 200, r.text
    got = r.json()
    want = client.post("/api/explain", json={"image_id": 0, "positive": caption, "negative": "a small green square",
                                             "tree": False}).json()
    assert got["image_id"] is None and want["image_id"] == 0
    for g, w in zip(got["models"], want["models"], strict=True):
        assert g["positive_score"] == pytest.approx(w["positive_score"], abs=1e-6)
        assert g["negative_score"] == pytest.approx(w["negative_score"], abs=1e-6)
        assert [h["method"] for h in g["heatmaps"]] == ["hilacam_positive", "hilacam_negative", "anchor", "dire"]
    assert got["colour_bars"][0]["vmax"] == pytest.approx(want["colour_bars"][0]["vmax"], rel=1e-5)
    assert "not an image" in _error(client.post("/api/explain/upload", files={"file": ("x.png", b"<svg></svg>", "image/png")},
                                                data={"positive": caption}), 415)
    big = io.BytesIO()
    Image.new("RGB", (400, 300)).save(big, format="PNG")
    assert "exceeds the limit of 100000" in _error(client.post(
        "/api/explain/upload", files={"file": ("b.png", big.getvalue(), "image/png")}, data={"positive": "a"}), 413)
    assert "positive" in _error(client.post("/api/explain/upload", files={"file": ("m.png", png, "image/png")}), 422)
    assert "positive" in _error(client.post("/api/explain/upload", files={"file": ("m.png", png, "image/png")},
                                            data={"positive": "a\x00b"}), 422)


def test_heavy_work_in_its_own_process(world, state):
    """Explain, clustering and text embedding through a `HeavyWorker` (spawned processes with their
    own state) answer what the in-process path answers; the searches stay in this process."""
    import functools

    from fastapi.testclient import TestClient

    from vlctl.serve.app import create_app
    from vlctl.serve.config import ServeConfig
    from vlctl.serve.heavy import HeavyWorker

    heavy = HeavyWorker(functools.partial(world_state, world), threads=1)
    heavy.wait_ready(120)
    with TestClient(create_app(world_state(world), ServeConfig(), heavy)) as c:
        caption = state.explain.caption(2)
        body = {"image_id": 2, "positive": caption, "negative": "a big red square", "tree": False}
        got = c.post("/api/explain", json=body)
        assert got.status_code == 200, got.text
        from vlctl.serve import work

        want = work.explain(state.explain, 2, caption, "a big red square", False)
        assert [m["positive_score"] for m in got.json()["models"]] == pytest.approx(
            [m["positive_score"] for m in want["models"]], abs=1e-6)
        assert [h["image"] for h in got.json()["models"][1]["heatmaps"]] == [h["image"] for h in
                                                                             want["models"][1]["heatmaps"]]
        assert "no image 99" in _error(c.post("/api/explain", json={**body, "image_id": 99}), 404)
        job = _wait(c, c.post("/api/cluster", json={"collection": "store", "attribute": "size", "seed": 1}).json())
        assert job["status"] == "done", job
        coll = state.collections["store"]
        ids = coll.controlembed.cluster(coll.store.embeddings(), "size", seed=1)
        assert sorted(cl["size"] for cl in job["result"]["clusters"]) == sorted(np.bincount(ids, minlength=2).tolist())
        assert c.post("/api/search", json={"collection": "store", "image_id": 1, "k": 2}).status_code == 200
        # a text query is embedded by the process of texts (its own model copy), then searched here
        app_state = c.app.state.vlctl.collections["store"]
        app_state.encoder.embed_texts = lambda texts: pytest.fail("the text was embedded in the server process")
        hits = c.post("/api/search", json={"collection": "store", "text": "a small blue square", "k": 3}).json()["hits"]
        want = coll.store.search(coll.encoder.embed_texts(["a small blue square"]), k=3)
        assert [h["id"] for h in hits] == want.ids[0].tolist()
        np.testing.assert_allclose(app_state.text_queries.get("a small blue square"),
                                   coll.encoder.embed_texts(["a small blue square"]), atol=1e-6)


# --- images, reports, safety ---------------------------------------------------------------------


def test_images_by_id_only(client, world):
    r = client.get("/api/images/store/5?size=40")
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    got = np.asarray(Image.open(io.BytesIO(r.content)).convert("RGB"))
    np.testing.assert_array_equal(got, np.asarray(Image.open(world["photos"] / "img05.png").convert("RGB")))
    assert client.get("/api/images/explain/5?size=20").status_code == 200
    _error(client.get("/api/images/store/24"), 404)
    _error(client.get("/api/images/store/-1"), 422)
    _error(client.get("/api/images/store/1?size=5000"), 422)
    for bad in ("/api/images/..%2Fphotos/1", "/api/images/%2Fetc%2Fpasswd/1", "/reports/x/..%2F..%2Fetc%2Fpasswd"):
        assert client.get(bad).status_code in (404, 422)
    sample = client.get("/api/sample/store?n=5&seed=3").json()
    ids = sample["ids"]
    assert len(ids) == 5 and ids == sorted(ids) and all(0 <= i < N for i in ids)
    assert [(x["id"], x["file"]) for x in sample["items"]] == [(i, f"img{i:02d}.png") for i in ids]
    assert [x["label"] for x in sample["items"]] == [f"a {r['size']} {r['color']} square" for r in
                                                     (world["rows"][i] for i in ids)]
    examples = client.get("/api/info").json()["explain"]["examples"]
    assert [x["file"] for x in examples[:3]] == ["img00.png", "img01.png", "img02.png"]


def test_reports_serve_only_their_own_files(tmp_path, world):
    from fastapi.testclient import TestClient

    from vlctl.serve.app import create_app
    from vlctl.serve.state import find_reports

    rep = tmp_path / "out" / "recipe-a"
    (rep / "figures").mkdir(parents=True)
    (rep / "report.html").write_text("<h1>report</h1><img src='figures/f.png'>")
    Image.new("RGB", (4, 4)).save(rep / "figures" / "f.png")
    (tmp_path / "out" / "secret.txt").write_text("no")
    state = world_state(world)
    state.reports = find_reports(tmp_path / "out")
    c = TestClient(create_app(state))
    info = c.get("/api/info").json()["reports"]
    assert info == [{"id": "recipe-a", "title": "recipe-a", "url": "/reports/recipe-a/report.html",
                     "figures": ["figures/f.png"]}]
    assert c.get("/reports/recipe-a/report.html").text.startswith("<h1>report")
    assert c.get("/reports/recipe-a/figures/f.png").headers["content-type"] == "image/png"
    _error(c.get("/reports/recipe-a/../secret.txt"), 404)
    _error(c.get("/reports/recipe-a/figures/../../secret.txt"), 404)


def test_token_is_required_when_set(world):
    from fastapi.testclient import TestClient

    from vlctl.serve.app import create_app
    from vlctl.serve.config import ServeConfig

    c = TestClient(create_app(world_state(world), ServeConfig(token="s3cret")))
    assert "token" in _error(c.get("/api/info"), 401)
    _error(c.get("/docs"), 401)
    _error(c.get("/api/info", headers={"Authorization": "Bearer wrong"}), 401)
    assert c.get("/api/info", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    page = c.get("/?token=s3cret")
    assert page.status_code == 200 and "vlctl_token=s3cret" in page.headers["set-cookie"]
    assert "HttpOnly" in page.headers["set-cookie"] and "SameSite=Strict" in page.headers["set-cookie"]
    assert c.get("/api/images/store/1").status_code == 200  # the cookie the page got
    c.cookies.clear()
    _error(c.get("/api/images/store/1"), 401)


def test_a_request_past_the_timeout_is_a_json_504(world, monkeypatch):
    from fastapi.testclient import TestClient

    from vlctl.serve import work
    from vlctl.serve.app import create_app
    from vlctl.serve.config import ServeConfig

    release, finished = threading.Event(), []

    def stuck(*a, **k):  # a search that ends only when the test lets it
        release.wait(30)
        finished.append(True)

    monkeypatch.setattr(work, "search", stuck)
    c = TestClient(create_app(world_state(world), ServeConfig(request_timeout=0.05)))
    assert "longer than 0.05 s" in _error(c.post("/api/search", json={"collection": "store", "text": "a"}), 504)
    assert finished == []  # the 504 came while the work was still running, not after it
    release.set()


def test_cli_refusals(capsys, world):
    from vlctl.cli import main

    assert main(["serve", str(world["store"]), "--host", "0.0.0.0"]) == 2
    assert "needs --token" in capsys.readouterr().err
    assert main(["serve", str(world["store"]), "--demo"]) == 2
    assert "one of them" in capsys.readouterr().err
    assert main(["serve", "--demo", "--demo-dir", str(world["root"])]) == 2
    err = capsys.readouterr().err
    assert "no demo here" in err and err.count("\n") == 1
    assert main(["serve", str(world["store"]), "--port", "70000"]) == 2
    assert "--port" in capsys.readouterr().err


def test_demo_stage_lookup(tmp_path):
    from vlctl.fsops import VlctlError
    from vlctl.recipes.shipped import stage_dir_name
    from vlctl.serve.demo import _contains, find_stage

    train = {"data": {"n": 3}, "lr": 0.1}
    for name, key in (("embed", {**train, "templates": ["a {}"]}), ("fit", {"embed": {**train, "x": 1}}),
                      ("fit", {"embed": {"data": {"n": 4}, "lr": 0.1}})):
        d = tmp_path / stage_dir_name(name, key)
        d.mkdir()
        (d / "done.json").write_text(json.dumps({"stage": name, "key": key, "seconds": 1}))
    (tmp_path / stage_dir_name("train", train)).mkdir()
    assert _contains(train, {"a": {"b": train}}) and not _contains(train, {"data": {"n": 3}})
    assert find_stage(tmp_path, "embed", train).name.startswith("embed-")
    assert find_stage(tmp_path, "fit", train).name == stage_dir_name("fit", {"embed": {**train, "x": 1}})
    with pytest.raises(VlctlError, match="not there"):
        find_stage(tmp_path, "train", train, exact=True)  # no done.json: unfinished
    with pytest.raises(VlctlError, match="expected one"):
        find_stage(tmp_path, "fit", {"lr": 0.1})


def test_cli_serves_the_store_as_asked(world, monkeypatch, capsys):
    import uvicorn
    from fastapi.testclient import TestClient

    from vlctl.cli import main
    from vlctl.serve.state import ExplainSet

    seen: dict = {}

    def run(server, sockets=None):  # `serve` binds its port first, then hands uvicorn the socket
        host, port = sockets[0].getsockname()[:2]
        seen.update(app=server.config.app, host=host, port=port)

    monkeypatch.setattr(uvicorn.Server, "run", run)
    monkeypatch.setattr(ExplainSet, "warm", lambda self: None)  # spaCy: the explain test loads it
    monkeypatch.setenv("VLCTL_SERVE_TOKEN", "tok")
    assert main(["serve", str(world["store"]), "--controlembed", str(world["ce"]), "--host", "0.0.0.0",
                 "--port", "0", "--max-pixels", "5000", "--no-heavy-process"]) == 0
    err = capsys.readouterr().err
    assert seen["host"] == "0.0.0.0" and seen["port"] > 0 and f":{seen['port']}/?token=TOKEN" in err
    c = TestClient(seen["app"])
    _error(c.get("/api/info"), 401)
    info = c.get("/api/info", headers={"Authorization": "Bearer tok"}).json()
    assert info["collections"][0]["attributes"] == ["color", "size"] and not info["collections"][0]["tevi"]
    assert info["limits"]["max_pixels"] == 5000


def test_uploads_read_as_embed_reads_files(client, state, tmp_path):
    """Issue 43: a TIFF upload was refused as "not an image" though `embed` reads TIFF; an upload
    goes through the one reader, so a multipage TIFF and an EXIF-rotated JPEG search as their
    plain twins do."""
    from messy_folder import make_messy_folder

    messy = make_messy_folder(tmp_path)
    coll = state.collections["store"]

    def hits(rel):
        r = client.post("/api/search/upload", files={"file": (Path(rel).name, (messy.photos / rel).read_bytes(),
                                                              "application/octet-stream")},
                        data={"collection": "store", "k": "4"})
        assert r.status_code == 200, r.text
        return [(h["id"], round(h["score"], 4)) for h in r.json()["hits"]]

    for variant in ("twins/pages.tif", "twins/exif_orientation_6.jpg"):
        want = coll.store.search(coll.encoder.embed_images([messy.photos / messy.twins[variant]]), k=4)
        got = hits(variant)
        assert [i for i, _ in got] == want.ids[0].tolist()
        if variant.endswith(".tif"):  # lossless: the same pixels, the same scores
            assert [s for _, s in got] == [round(float(s), 4) for s in want.scores[0]]


# --- the page's own files (issue 43) ---------------------------------------------------------------


def test_favicon_and_docs_need_no_network(client):
    """Issue 43: the favicon was a 404; /docs loaded Swagger UI from a CDN (blank offline). Both are
    served from the package, and no page the server sends names another host."""
    r = client.get("/favicon.ico")
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml") and b"<svg" in r.content
    docs = client.get("/docs")
    assert docs.status_code == 200 and "/static/docs.js" in docs.text and "swagger" not in docs.text.lower()
    import re

    from vlctl.serve.app import STATIC

    for page in ("index.html", "docs.html", "docs.js", "app.js", "app.css"):
        text = (STATIC / page).read_text()
        assert not re.search(r"(src|href)=[\"']?(https?:)?//|@import|url\(\s*['\"]?https?:", text), page
    assert client.get("/static/docs.js").status_code == 200 and client.get("/openapi.json").status_code == 200


def test_steer_note_names_untrained_attributes_in_words(world):
    """Issue 43: "not trained on ['the weather']" is a Python list; the note says it in words."""
    from fastapi.testclient import TestClient

    from vlctl.embeddings.store import open_store
    from vlctl.methods.controlembed.estimator import ControlEmbed
    from vlctl.serve.app import create_app
    from vlctl.serve.state import Collection, ServeState

    store = open_store(world["store"])
    meta = store.metadata()
    labels = {c: [m[c] for m in meta] for c in ("color", "size")}
    model = ControlEmbed(steps=5, align_weight=0.0, images_per_subclass=2, hidden=16, seed=0).fit(
        store.embeddings(), labels, encoder_id=store.encoder_id)  # MiniLM conditions: free text is embedded
    c = TestClient(create_app(ServeState({"s": Collection("s", store, controlembed=model)})))
    r = c.post("/api/steer", json={"collection": "s", "image_id": 0, "attribute": "the weather",
                                   "attribute_b": "color", "alpha": 0.5, "k": 3})
    assert r.status_code == 200, r.text
    assert r.json()["note"].startswith("not trained on: the weather; ") and "trained on: color, size)" in r.json()["note"]
    assert "[" not in r.json()["note"]


# --- the latents of the served SAE (issue 46) -----------------------------------------------------


def test_latents_listed_named_and_found(client, state, world):
    from vlctl.methods.sae.describe import normalise

    coll = state.collections["store"]
    assert client.get("/api/info").json()["collections"][0]["sae"]
    coll.latents.pop("table", None)
    assert "not described yet" in _error(client.get("/api/latents/store"), 400)
    job = _wait(client, client.post("/api/latents", json={"collection": "store"}).json())
    assert job["status"] == "done", job
    want = [r for r in coll.tevi.sae_.describe(coll.store, k=16, as_frame=False) if r["live"]]
    assert job["result"]["live"] == len(want) > 0 and job["result"]["summary"]["live"] == len(want)
    again = client.post("/api/latents", json={"collection": "store"}).json()
    assert again["id"] == job["id"]  # described once
    listed = client.get("/api/latents/store?limit=200").json()
    by_freq = sorted(want, key=lambda r: (-r["frequency"], r["latent"]))
    assert listed["total"] == len(want) and [r["latent"] for r in listed["latents"]] == [r["latent"] for r in by_freq]
    for got, ref in zip(listed["latents"], by_freq):
        assert got["names"] == ref["names"] and got["frequency"] == pytest.approx(ref["frequency"])
        assert got["top_images"] == ref["top_images"][:6]
    # find by name: every latent with a name containing the words, the top-name matches first
    top = by_freq[0]["names"][0]["name"]
    found = client.get("/api/latents/store", params={"q": top.upper()}).json()["latents"]
    assert found[0]["names"][0]["name"] == top
    assert {r["latent"] for r in found} == {r["latent"] for r in want
                                            if any(normalise(top) in normalise(n["name"]) for n in r["names"])}
    assert client.get("/api/latents/store?q=zebra").json() == {"collection": "store", "total": 0, "offset": 0,
                                                               "latents": []}
    # open one: its top images as the page shows images, the activation as score
    one = client.get(f"/api/latents/store/{by_freq[0]['latent']}").json()
    assert [h["id"] for h in one["hits"]] == by_freq[0]["top_images"]
    assert [h["score"] for h in one["hits"]] == pytest.approx(by_freq[0]["top_values"])
    assert [h["file"] for h in one["hits"]] == [f"img{i:02d}.png" for i in by_freq[0]["top_images"]]
    dead = next(r for r in range(coll.tevi.sae_.model_.W_D.shape[0]) if r not in {w["latent"] for w in want})
    assert "not a live latent" in _error(client.get(f"/api/latents/store/{dead}"), 404)


def test_latents_of_an_sae_served_without_tevi(world, capsys):
    """`vlctl serve STORE --sae DIR`: the Latents tab for a user with only `vlctl fit sae`."""
    from fastapi.testclient import TestClient

    from vlctl.cli import main
    from vlctl.cli.serve import build_state, serve_args
    from vlctl.methods.sae.model import SparseAutoencoder
    from vlctl.serve.app import create_app

    p = argparse.ArgumentParser()
    serve_args(p)
    state = build_state(p.parse_args([str(world["store"]), "--sae", str(world["tevi"] / "sae")]))
    coll = state.collections["store"]
    assert coll.tevi is None and coll.sae is not None
    c = TestClient(create_app(state))
    info = c.get("/api/info").json()["collections"][0]
    assert info["sae"] and not info["tevi"]
    job = _wait(c, c.post("/api/latents", json={"collection": "store"}).json())
    assert job["status"] == "done", job
    want = [r for r in SparseAutoencoder.load(world["tevi"] / "sae").describe(coll.store, k=16) if r["live"]]
    listed = c.get("/api/latents/store?limit=200").json()
    assert listed["total"] == len(want) > 0
    assert sorted(r["latent"] for r in listed["latents"]) == [r["latent"] for r in want]
    assert {r["latent"]: r["names"] for r in listed["latents"]} == {r["latent"]: r["names"] for r in want}
    # one SAE per page: a TEVI model brings its own
    assert main(["serve", str(world["store"]), "--tevi", str(world["tevi"]), "--sae", str(world["tevi"] / "sae"),
                 "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "--sae goes without --tevi" in err and err.count("\n") == 1


def test_latents_refused_without_an_sae(world):
    from fastapi.testclient import TestClient

    from vlctl.serve.app import create_app
    from vlctl.serve.state import state_for_store

    c = TestClient(create_app(state_for_store(world["store"], controlembed=world["ce"])))
    assert not c.get("/api/info").json()["collections"][0]["sae"]
    assert "no SAE is loaded" in _error(c.post("/api/latents", json={"collection": "store"}), 400)
    assert "no SAE is loaded" in _error(c.get("/api/latents/store"), 400)
    assert "no collection 'x'; served: store" in _error(c.post("/api/latents", json={"collection": "x"}), 404)
