"""Issue 46: naming an SAE's latents with text (`vlctl.methods.sae.describe`), `SparseAutoencoder.describe`
/ `latents_of`, and `vlctl inspect sae`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from PIL import Image
from sklearn.metrics import roc_auc_score

from vlctl.cli import main
from vlctl.embeddings.store import create_store, open_store
from vlctl.encoders.factory import load_encoder
from vlctl.encoders.tiny_model import create_model
from vlctl.encoders.tiny_pretrained import save_pretrained
from vlctl.methods.sae.describe import (
    Codes,
    caption_vocabulary,
    encode_codes,
    mention_matrix,
    mentions,
    nearest_names,
    pair_auc,
    shuffled_rows,
)
from vlctl.methods.sae.model import SparseAutoencoder

# --- the pieces, against hand references ------------------------------------------------------------


def _codes(z: np.ndarray) -> Codes:
    r, c = np.nonzero(z > 0)
    return Codes(r.astype(np.int64), c.astype(np.int64), z[r, c].astype(np.float32), *z.shape)


def test_pair_auc_is_sklearns_roc_auc_with_ties_and_sparse_zeros():
    rng = np.random.default_rng(0)
    n, d1, s = 80, 9, 6
    # integer activations: many ties among the firing images, and most images at 0
    z = np.where(rng.random((n, d1)) < 0.35, rng.integers(1, 4, (n, d1)), 0).astype(np.float32)
    present = rng.random((n, s)) < 0.3
    lat, name = np.repeat(np.arange(d1), s), np.tile(np.arange(s), d1)
    want = [roc_auc_score(present[:, b], z[:, a]) for a, b in zip(lat, name)]
    for block in (1, 4, 2048):  # the latent blocks change nothing
        np.testing.assert_allclose(pair_auc(_codes(z), sp.csr_matrix(present), lat, name, block=block), want,
                                   rtol=0, atol=1e-12)


def test_pair_auc_by_hand_and_undefined_without_both_classes():
    # 4 images; latent 0 fires 2.0 on image 0, 1.0 on images 1 and 3. Name 0: images 0 and 2.
    # Ranks ascending: image 2 (0) -> 1; images 1, 3 (1.0) -> 2.5; image 0 (2.0) -> 4.
    # U = (4 + 1) - 2*3/2 = 2, AUC = 2 / (2 * 2) = 0.5. Name 1 is on every image: no AUC.
    z = np.array([[2.0], [1.0], [0.0], [1.0]], np.float32)
    present = sp.csr_matrix(np.array([[1, 1], [0, 1], [1, 1], [0, 1]], bool))
    auc = pair_auc(_codes(z), present, np.array([0, 0]), np.array([0, 1]))
    assert auc[0] == 0.5 and np.isnan(auc[1])


def test_mentions_clauses_and_negation():
    assert mentions("thinning - 7 - red - no swelling") == {"thinning", "7", "red", "no swelling"}
    # "no leash" is a mention of "no leash", not of "leash"; no phrase starts or ends with "the"/"on"
    assert mentions("A dog runs on the beach, no leash") == {"dog", "runs", "dog runs", "beach", "no leash"}
    assert mentions("a red t-shirt") == {"red", "t-shirt", "red t-shirt"}
    # against a vocabulary: any run that is a name, still not a negated one
    assert mentions("no swelling - swelling of the digit", vocabulary={"swelling", "of the"}) == {"swelling",
                                                                                                  "of the"}
    assert mentions("no swelling - red", vocabulary={"swelling"}) == set()
    caps = ["red - no swelling", "blue - no swelling", "red - swelling", "green"]
    assert caption_vocabulary(caps, min_count=2) == ["no swelling", "red"]  # by count, then alphabetical
    assert caption_vocabulary(caps, min_count=1, max_size=3) == ["no swelling", "red", "blue"]


def test_mention_matrix_ors_an_images_captions():
    m = mention_matrix(["red dog", "blue", "a red cat", "no red"], np.array([0, 0, 1, 2]), ["red", "blue", "Dog"], 3)
    assert m.toarray().tolist() == [[True, True, True], [True, False, False], [False, False, False]]


def test_nearest_names_centre_the_vocabulary_cosine_and_margin():
    # Names a common offset (5, 0, 0) apart from their own direction: only after centring does
    # each row find its own name.
    t = np.array([[5.0, 1, 0], [5.0, 0, 1], [5.0, -1, -1]])
    dec = np.array([[0.0, 1, 0], [0.0, 0, 1]])
    idx, cos = nearest_names(dec, t, n=3)
    c = t - t.mean(0)
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    want = dec @ c.T
    assert idx[:, 0].tolist() == [0, 1]
    np.testing.assert_allclose(cos, np.take_along_axis(want, idx, 1), atol=1e-6)
    assert (np.diff(cos, axis=1) <= 0).all()


def test_encode_codes_are_the_saes_codes_in_chunks():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(50, 8)).astype(np.float32)
    sae = SparseAutoencoder(d_latent=24, k=3, epochs=2, batch_size=16, init_b_pre="mean").fit(x, "enc")
    # the same chunks through the dense encode (a GEMM's rounding depends on its row count)
    dense = np.concatenate([sae.encode(x[a:a + 7]).numpy() for a in range(0, 50, 7)])
    codes = encode_codes(sae.model_, (x[a:a + 7] for a in range(0, 50, 7)), 50)
    got = np.zeros_like(dense)
    got[codes.rows, codes.latents] = codes.values
    np.testing.assert_array_equal(got, dense)
    rows, vals = codes.top_rows(4)
    for r in range(24):
        order = np.argsort(-dense[:, r], kind="stable")[:4]
        fired = dense[order, r] > 0
        assert rows[r][fired].tolist() == order[fired].tolist() and (rows[r][~fired] == -1).all()
        np.testing.assert_array_equal(vals[r][fired], dense[order[fired], r])


def test_shuffled_rows_move_only_live_latents():
    live = np.array([True, False, True, True, False, True])
    perm = shuffled_rows(6, live, seed=3)
    assert sorted(perm.tolist()) == list(range(6)) and perm[1] == 1 and perm[4] == 4
    assert set(perm[live].tolist()) == {0, 2, 3, 5}


# --- a store, a CG-SAE, and the command ------------------------------------------------------------

COLORS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}
N_IMAGES = 36


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A store of 36 coloured squares (PNG files) captioned "<colour> - large", embedded with a
    random-weight TinyCLIP saved as a directory (the store records its spec); a CG-SAE whose
    latents are the three colours' text embeddings; an SAE of another encoder."""
    root = tmp_path_factory.mktemp("describe")
    save_pretrained(create_model("mad-quick", seed=0), root / "model")
    encoder = load_encoder(f"tiny:{root / 'model'}")
    rng = np.random.default_rng(0)
    (root / "img").mkdir()
    paths, captions = [], []
    for i in range(N_IMAGES):
        color = list(COLORS)[i % 3]
        a = np.clip(np.full((28, 28, 3), COLORS[color]) + rng.integers(-20, 20, (28, 28, 3)), 0, 255)
        Image.fromarray(a.astype(np.uint8)).save(root / "img" / f"{i:02d}.png")
        paths.append(str(root / "img" / f"{i:02d}.png"))
        captions.append(f"{color} - large")
    img = encoder.embed_images(paths)
    store = create_store(root / "store", encoder.id, encoder.embed_dim, encoder_spec=encoder.spec)
    store = store.add(img, [{"path": p} for p in paths], texts=encoder.embed_texts(captions),
                      text_metadata=[{"text": c, "image": i} for i, c in enumerate(captions)], normalized=True)
    colors = encoder.embed_texts(list(COLORS))
    sae = SparseAutoencoder.from_concepts(colors, k=1, epochs=30, batch_size=12, lr=1e-2, aux_k=0).fit(store)
    sae.save(root / "sae")
    SparseAutoencoder(d_latent=6, k=2, epochs=1).fit(img, "another-encoder").save(root / "sae-other")
    return root, store, sae


def _run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 and "--json" in argv else out), err


def test_inspect_sae_names_each_colour_latent_and_checks_it(world, capsys, tmp_path):
    root, store, sae = world
    rc, res, err = _run(["inspect", "sae", "--store", str(root / "store"), "--sae", str(root / "sae"), "--out",
                         str(tmp_path / "out"), "--k", "4", "--json"], capsys)
    assert rc == 0, err
    rows = [json.loads(ln) for ln in (tmp_path / "out" / "latents.jsonl").read_text().splitlines()]
    assert [r["latent"] for r in rows] == [0, 1, 2]
    # The vocabulary is the captions' phrases mentioned twice or more; its centred embeddings hold
    # the CG-SAE's rows (the colours', centred on the colours' mean) up to "large", so each latent's
    # top name is its colour.
    assert res["vocabulary"] == 4 and res["vocabulary_source"] == "captions"
    assert [r["names"][0]["name"] for r in rows] == list(COLORS)
    # The AUC is sklearn's on the SAE's dense codes, for the images whose caption mentions the name.
    z = sae.encode(store.image_emb).numpy()
    color_of = np.arange(N_IMAGES) % 3
    for r in rows:
        if r["live"]:
            for nm in r["names"]:
                if nm["name"] in COLORS:
                    want = roc_auc_score(color_of == list(COLORS).index(nm["name"]), z[:, r["latent"]])
                    assert nm["auc"] == pytest.approx(want, abs=1e-12)
        assert r["frequency"] == pytest.approx((z[:, r["latent"]] > 0).mean())
        top = np.argsort(-z[:, r["latent"]], kind="stable")[:4]
        assert r["top_images"] == [int(i) for i in top if z[i, r["latent"]] > 0]
    assert res["top_name"]["checked"] == res["live"] and "shuffled_decoder" in res
    live = [r for r in rows if r["live"]]
    assert res["top_name"]["auc_mean"] == pytest.approx(np.mean([r["names"][0]["auc"] for r in live]))
    # the margin is the cosine over the next name's
    assert rows[0]["names"][0]["margin"] == pytest.approx(rows[0]["names"][0]["cosine"] - rows[0]["names"][1]["cosine"])
    # contact sheets for the live latents, named in the rows; report and marker written
    assert res["contact_sheets"] == len(live) and all((tmp_path / "out" / r["sheet"]).is_file() for r in live)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Dead latents" in report and "shuffled decoder" in report and (tmp_path / "out" / "report.html").is_file()
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["format"] == "vlctl.inspect-sae/1"
    # The Python front door gives the same table.
    api = SparseAutoencoder.load(root / "sae").describe(open_store(root / "store"), k=4, as_frame=False)
    assert api == [{k: v for k, v in r.items() if k != "sheet"} for r in rows]


def test_describe_as_frame_is_the_same_table(world):
    pd = pytest.importorskip("pandas")
    root, store, _ = world
    sae = SparseAutoencoder.load(root / "sae")
    rows = sae.describe(store, k=4)  # the default: the list of dicts
    frame = sae.describe(store, k=4, as_frame=True)
    assert isinstance(rows, list) and isinstance(frame, pd.DataFrame)
    assert list(frame.columns) == list(rows[0]) and len(frame) == len(rows)
    assert frame.to_dict("records") == rows


def test_latents_of_names_the_active_latents(world):
    root, store, _ = world
    sae = SparseAutoencoder.load(root / "sae")
    x = store.image_emb[0]
    assert [a["name"] for a in sae.latents_of(x)] == [None] * len(sae.latents_of(x))  # before describe: unnamed
    sae.describe(store, as_frame=False)
    got = sae.latents_of(x)
    z = sae.encode(x[None]).numpy()[0]
    assert [a["latent"] for a in got] == [int(i) for i in np.argsort(-z, kind="stable") if z[i] > 0]
    assert [a["name"] for a in got] == [sae.latent_names_[a["latent"]] for a in got]
    assert got[0]["value"] == pytest.approx(float(z.max()))
    # an image file goes through the store's encoder: the same latents as its stored embedding
    assert [a["latent"] for a in sae.latents_of(str(root / "img" / "00.png"))] == [a["latent"] for a in got]


def test_fit_sae_concepts_init_starts_at_the_concepts_and_trains_them(world, capsys, tmp_path):
    root = world[0]
    (tmp_path / "colors.txt").write_text("red\ngreen\nblue\n", encoding="utf-8")
    base = ["fit", "sae", "--store", str(root / "store"), "--k", "1", "--aux-k", "0", "--epochs", "3",
            "--batch-size", "12", "--lr", "1e-2", "--json"]
    concepts = ["--concepts", str(tmp_path / "colors.txt"), "--encoder", f"tiny:{root / 'model'}"]
    rc, res, err = _run([*base, *concepts, "--concepts-init", "--out", str(tmp_path / "start")], capsys)
    assert rc == 0, err
    assert res["n_latents"] == 3
    sae = SparseAutoencoder.load(tmp_path / "start")
    assert sae.config_.concepts_init and not sae.config_.concepts_fixed
    # The CG-SAE of the same file keeps its rows where this one started; training moved them, not far.
    rc, _, err = _run([*base, *concepts, "--out", str(tmp_path / "cg")], capsys)
    assert rc == 0, err
    cg = SparseAutoencoder.load(tmp_path / "cg")
    assert cg.config_.concepts_fixed and not cg.config_.concepts_init
    w, w0 = sae.model_.W_D.detach(), cg.model_.W_D.detach()
    assert not torch.allclose(w, w0) and (torch.nn.functional.cosine_similarity(w, w0, dim=1) > 0.5).all()
    rc, _, err = _run([*base, "--concepts-init", "--out", str(tmp_path / "none")], capsys)
    assert rc == 2 and "--concepts-init needs --concepts" in err and len(err.strip().splitlines()) == 1


def test_inspect_sae_bad_input_is_one_line_exit_2(world, capsys, tmp_path):
    root, _, _ = world
    base = ["inspect", "sae", "--store", str(root / "store"), "--out", str(tmp_path / "o")]
    bad = tmp_path / "vocab.txt"
    bad.write_bytes(b"red\n\xff\xfe blue\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n\n", encoding="utf-8")
    cases = [
        (["--sae", str(root / "sae-other")], "another-encoder"),
        (["--sae", str(root / "sae"), "--vocabulary", str(bad)], "vocab.txt: not UTF-8 at byte 4"),
        (["--sae", str(root / "sae"), "--vocabulary", str(empty)], "empty.txt: empty vocabulary file"),
        (["--sae", str(root / "sae"), "--min-count", "1000"], "the vocabulary is empty"),
    ]
    for extra, says in cases:
        rc, out, err = _run([*base, *extra], capsys)
        assert rc == 2 and out == "" and says in err and len(err.strip().splitlines()) == 1, err
        assert "Traceback" not in err


# --- TEVI explained with the names --------------------------------------------------------------------


def test_kept_and_dropped_by_hand():
    from vlctl.methods.tevi.explain import explain_line, kept_and_dropped

    code = torch.tensor([0.0, 2.0, 0.5, 1.0])
    mask = torch.tensor([1.0, 0.9, 0.1, 0.5])  # latent 0 is inactive: neither kept nor dropped
    got = kept_and_dropped(code, mask, ["a", "b", "c", "d"])
    assert [r["latent"] for r in got["kept"]] == [1, 3] and [r["latent"] for r in got["dropped"]] == [2]
    assert got["dropped"][0] == {"latent": 2, "name": "c", "value": 0.5, "mask": pytest.approx(0.1)}
    assert explain_line(got) == "kept: b 2.00 (m 0.90), d 1.00 (m 0.50); dropped: c 0.50 (m 0.10)"


def test_search_and_score_tevi_explain(world, capsys, tmp_path):
    from vlctl.methods.tevi.estimator import TEVI
    from vlctl.methods.tevi.explain import kept_and_dropped

    root, store, sae = world
    image_emb, text_emb = store.pairs()
    tevi = TEVI(hidden=16, epochs=2, batch_size=12, holdout=0.0).fit(image_emb, text_emb, sae=sae,
                                                                     encoder_id=store.encoder_id)
    tevi.save(tmp_path / "tevi")
    rc, res, err = _run(["search", str(root / "store"), "--text", "red - large", "--rerank", f"tevi:{tmp_path / 'tevi'}",
                         "-k", "3", "--explain", "--json"], capsys)
    assert rc == 0, err
    names = ["red", "green", "blue"]  # the CG-SAE's latents, named as inspect names them (test above)
    mask = tevi.masks(load_encoder(store.encoder_spec).embed_texts(["red - large"]))[0]
    codes = sae.encode(store.vectors([h["id"] for h in res["hits"]]))  # one batch, as the command encodes them
    assert [h["explain"] for h in res["hits"]] == json.loads(json.dumps([kept_and_dropped(c, mask, names)
                                                                         for c in codes]))
    rc, _, err = _run(["search", str(root / "store"), "--text", "red", "--explain"], capsys)
    assert rc == 2 and "--explain goes with --text and --rerank" in err
    rc, res, err = _run(["score", "tevi", "--store", str(root / "store"), "--tevi", str(tmp_path / "tevi"), "--out",
                         str(tmp_path / "s.npz"), "--explain", "2", "--json"], capsys)
    assert rc == 0, err
    assert [e["caption"] for e in res["explain"]] == [0, 1] and res["explain"][0]["text"] == "red - large"
    scores = np.load(tmp_path / "s.npz")["scores"]
    assert [e["image"] for e in res["explain"]] == scores[:, :2].argmax(0).tolist()
    rc, out, _ = _run(["score", "tevi", "--store", str(root / "store"), "--tevi", str(tmp_path / "tevi"), "--out",
                       str(tmp_path / "s2.npz"), "--explain", "1"], capsys)
    assert rc == 0 and "caption 0 'red - large' -> image" in out and "kept:" in out
