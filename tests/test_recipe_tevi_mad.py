"""End to end: tevi-mad on a tiny configuration (sharing mad-clip's stages), the numbers it
reports recomputed from its arrays, and `vlctl fit sae / fit tevi / score tevi` on its cache."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from vlctl.eval import editing, metrics
from vlctl.recipes.tevi import mad as tevi_mad
from vlctl.recipes.tevi import mad_clip, mad_report

TINY_CLIP = mad_clip.MadClipRecipe(n_train=256, n_test=128, model="mad-quick", epochs=1, batch_size=64,
                                   warmup_steps=1, procs=1)
# Two seeds (Tables A1/A2 as mean +- std) and the issue-23 levers switched on, so their wiring runs.
TINY = tevi_mad.TeviMadRecipe(sae_epochs=2, cg_epochs=2, mask_epochs=2, mask_hidden=32, mask_batch_size=64,
                              sae_batch_size=64, rerank_k=10, sweep_k=(4,), sweep_expansion=(1,), sweep_epochs=1,
                              n_seeds=2, contradicting_batches=True, cg_group_mask=True, mask_mass_coef=0.1,
                              sae_resample_every=3, random_reading=True)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tevi")
    stages = root / "stages"
    mad_clip.run(root / "mad-clip", cfg=TINY_CLIP, stages=stages)
    tevi_mad.run(root / "tevi-mad", cfg=TINY, clip_cfg=TINY_CLIP, stages=stages)
    return root


def test_reuses_the_mad_clip_stages(tiny_run):
    r = json.loads((tiny_run / "tevi-mad" / "results.json").read_text())
    assert all(r["timings"][s]["cached"] for s in ("data-test", "train", "embed"))
    assert not r["timings"]["tevi-cg"]["cached"]


def test_results_recompute_from_arrays(tiny_run):
    out = tiny_run / "tevi-mad"
    r = json.loads((out / "results.json").read_text())
    assert set(r["conditioning"]) == set(mad_report.EDITED) and r["headline"] == "cg"
    a = np.load(out / "arrays" / "conditioning.npz")
    assert a["original_emb"].shape == a["edited_emb"].shape == (128, 32)
    for c in mad_report.EDITED:
        got = editing.conditioning_accuracy(a["original_emb"], a["edited_emb"], a[f"text_{c}"], a[f"label_{c}"],
                                            a[f"in_caption_{c}"])
        assert got == pytest.approx(r["conditioning"][c], nan_ok=True)
        leak = editing.leakage_accuracy(a["swapped_emb"], a[f"text_{c}"], a[f"label_{c}"],
                                        a[f"caption_label_{c}"][a["swap_perm"]])
        assert leak == pytest.approx(r["leakage"][c], nan_ok=True)
    ret = np.load(out / "arrays" / "retrieval_cg.npz")
    rel = metrics.caption_relevance(ret["image_values"], ret["caption_values"])
    assert metrics.recall_at_k_relevant(ret["base_scores"], rel) == r["retrieval"]["base"]
    assert metrics.recall_at_k_relevant(ret["tevi_scores"], rel) == r["retrieval"]["tevi"]
    rr = {**{f"i2t{k}": v for k, v in metrics.recall_from_order(ret["rerank_order_i2t"], rel.T).items()},
          **{f"t2i{k}": v for k, v in metrics.recall_from_order(ret["rerank_order_t2i"], rel).items()}}
    assert rr == r["retrieval"]["tevi_rerank"]
    cos = metrics.positive_pair_cosine(a["edited_emb"], ret["text_emb"]).mean()
    assert cos == pytest.approx(r["alignment"]["after"], rel=1e-6)
    cg = np.load(out / "arrays" / "cg_sae.npz")
    assert cg["auc"].shape == (26, 26)
    assert np.mean(np.diag(editing.concept_auc_matrix(cg["latents"], cg["concept_present"]))) / 100 == pytest.approx(
        r["cg_sae"]["auc_own_mean"])
    assert set(r["sae"]) >= {"fvu", "dead_latents", "purity_mean"} and len(r["sae_sweep"]) == 1
    assert r["sae"]["dead_fraction"] == r["sae"]["dead_latents"] / r["sae"]["n_latents"]
    md = (out / "report.md").read_text()
    assert "Table A1" in md and "54.3" in md  # the paper's learned-SAE not-in-caption figure beside ours
    for f in ("positive_cosine.png", "cg_sae_auc.png", "cg_sae_top_images.png"):
        assert (out / "figures" / f).stat().st_size > 1000


@pytest.mark.parametrize("variant", tevi_mad.FUSED)
def test_fused_rerank_recomputes_from_arrays(tiny_run, variant):
    out = tiny_run / "tevi-mad"
    f = json.loads((out / "results.json").read_text())["fused"][variant]
    a = np.load(out / "arrays" / f"retrieval_fused_{variant}.npz")
    rel = metrics.caption_relevance(a["image_values"], a["caption_values"])
    assert float(a["alpha"]) == f["alpha"] and f["heldout"]["n_images"] > 0 and f["note"]
    assert metrics.recall_at_k_relevant(a["base_scores"], rel) == f["test"]["base"]
    assert metrics.recall_at_k_relevant(a["tevi_scores"], rel) == f["test"]["tevi"]
    for name, o in (("tevi_rerank", "rerank"), ("fused", "fused")):
        got = {**{f"i2t{k}": v for k, v in metrics.recall_from_order(a[f"{o}_order_i2t"], rel.T).items()},
               **{f"t2i{k}": v for k, v in metrics.recall_from_order(a[f"{o}_order_t2i"], rel).items()}}
        assert got == f["test"][name]
    if f["alpha"] == 1:  # CLIP's ranking: the fused orders are CLIP's top k
        assert np.array_equal(a["fused_order_t2i"], np.argsort(-a["base_scores"], 0, kind="stable")[:len(a["fused_order_t2i"])])
    assert "Fused rerank: the" in (out / "report.md").read_text()


def test_leakage_and_seeds_recompute_for_every_variant(tiny_run):
    out = tiny_run / "tevi-mad"
    r = json.loads((out / "results.json").read_text())
    assert set(r["variants"]) == {"learned", "cg", "random"} and r["sae_random"]["n_latents"] == 26
    for v in tevi_mad.fitted_variants(TINY):
        res, follows = r["variants"][v], {}
        per_seed = []
        for s, name in ((0, f"conditioning_{v}.npz"), (1, f"conditioning_{v}_seed1.npz")):
            a = np.load(out / "arrays" / name)
            leak = {c: editing.leakage_accuracy(a["swapped_emb"], a[f"text_{c}"], a[f"label_{c}"],
                                                a[f"caption_label_{c}"][a["swap_perm"]]) for c in mad_report.EDITED}
            cond = {c: editing.conditioning_accuracy(a["original_emb"], a["edited_emb"], a[f"text_{c}"],
                                                     a[f"label_{c}"], a[f"in_caption_{c}"]) for c in mad_report.EDITED}
            per_seed.append((cond, leak))
            if s == 0:
                for c in mad_report.EDITED:
                    assert leak[c] == pytest.approx(res["leakage"][c], nan_ok=True)
                follows = {c: leak[c]["follows_image"] for c in mad_report.EDITED}
        assert res["summary"]["follows_image_min"] == pytest.approx(min(follows.values()), nan_ok=True)
        ms = r["seeds"][v]
        assert ms["seeds"] == [0, 1]
        for c in mad_report.EDITED:
            vals = [cond[c]["not_in_caption"] for cond, _ in per_seed]
            assert ms["conditioning"][c]["not_in_caption"]["mean"] == pytest.approx(np.mean(vals), nan_ok=True)
            assert ms["conditioning"][c]["not_in_caption"]["std"] == pytest.approx(np.std(vals), nan_ok=True)
            vals = [leak[c]["follows_image"] for _, leak in per_seed]
            assert ms["leakage"][c]["follows_image"]["mean"] == pytest.approx(np.mean(vals), nan_ok=True)
        ret = np.load(out / "arrays" / f"retrieval_{v}_seed1.npz")
        rel = metrics.caption_relevance(ret["image_values"], ret["caption_values"])
        t2i1 = metrics.recall_from_order(ret["top_order_t2i"], rel)["@1"]
        assert ms["retrieval"]["t2i@1"]["mean"] == pytest.approx((r["variants"][v]["retrieval"]["tevi"]["t2i@1"] + t2i1) / 2)
    md = (out / "report.md").read_text()
    assert "Follows image: worst category" in md and "Mean +- std over seeds [0, 1]" in md
    # the side-by-side table over the seeds: each SAE's row carries its seeds' mean +- std
    assert "The same over seeds [0, 1], mean +- std" in md
    for v in tevi_mad.fitted_variants(TINY):
        sm, rs = r["seeds"][v]["summary"], r["seeds"][v]["retrieval"]
        row = next(line for line in md.splitlines() if line.startswith(f"| {mad_report.TITLES[v][0]} | ")
                   and "+-" in line)
        assert mad_report._pm(sm["follows_image_min"]) in row and mad_report._pm(rs["t2i@1"]) in row


def test_contradicting_partners_by_hand():
    # columns: digit, color, thickthinning, swelling, fracture, scaling; -1 = not named
    cap = np.array([[3, 1, -1, 0, -1, 1],
                    [3, 2, -1, 0, -1, 1],   # row 0 with another color
                    [3, 1, -1, 1, -1, 1],   # row 0 with another swelling value
                    [4, 1, -1, 0, -1, 1],   # another digit only: not a contradiction
                    [3, 2, -1, 1, -1, 1]])  # differs from row 0 in two categories
    p = tevi_mad.contradicting_partners(cap, seed=0)
    assert p[0] in (1, 2) and p[1] in (0, 4) and p[2] in (0, 4) and p[3] == -1 and p[4] in (1, 2)
    assert tevi_mad.concept_categories()[:11] == (0,) * 10 + (1,)  # 10 digit latents, then color


def test_recall_from_order_matches_recall_at_k_relevant():
    rng = np.random.default_rng(0)
    scores = rng.random((30, 40))  # no ties
    rel = rng.random((30, 40)) < 0.1
    rel[0] = True  # every text has a relevant image
    want = metrics.recall_at_k_relevant(scores, rel)
    t2i = metrics.recall_from_order(np.argsort(-scores, axis=0), rel)
    i2t = metrics.recall_from_order(np.argsort(-scores.T, axis=0), rel.T)
    assert {f"t2i{k}": v for k, v in t2i.items()} == {k: v for k, v in want.items() if k.startswith("t2i")}
    assert {f"i2t{k}": v for k, v in i2t.items()} == {k: v for k, v in want.items() if k.startswith("i2t")}


def _vlctl(*args):
    return subprocess.run([sys.executable, "-m", "vlctl", *args, "--json"], capture_output=True, text=True, check=False)


def test_cli_fit_and_score(tiny_run, tmp_path):
    (cache,) = (tiny_run / "stages").glob("embed-train-*/cache/*")
    r = _vlctl("fit", "sae", "--cache", str(cache), "--out", str(tmp_path / "sae"), "--k", "4", "--expansion", "2",
               "--aux-k", "4", "--epochs", "1", "--batch-size", "64")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["n_latents"] == 64
    (tmp_path / "concepts.txt").write_text("red\nblue\n\nswelling\n")
    (model,) = (tiny_run / "stages").glob("train-*/model")
    r = _vlctl("fit", "sae", "--cache", str(cache), "--out", str(tmp_path / "cg"), "--concepts",
               str(tmp_path / "concepts.txt"), "--encoder", f"tiny:{model}", "--k", "2", "--aux-k", "0", "--epochs", "1")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["n_latents"] == 3  # one latent per concept line
    (tmp_path / "empty.txt").write_text("\n")
    r = _vlctl("fit", "sae", "--cache", str(cache), "--out", str(tmp_path / "cg2"), "--concepts",
               str(tmp_path / "empty.txt"), "--encoder", f"tiny:{model}")
    assert r.returncode == 2 and "empty concept list" in r.stderr
    r = _vlctl("fit", "tevi", "--cache", str(cache), "--sae", str(tmp_path / "sae"), "--out", str(tmp_path / "tevi"),
               "--hidden", "16", "--epochs", "1", "--batch-size", "64")
    assert r.returncode == 0, r.stderr
    r = _vlctl("score", "tevi", "--cache", str(cache), "--tevi", str(tmp_path / "tevi"), "--out",
               str(tmp_path / "scores.npz"))
    assert r.returncode == 0, r.stderr
    s = np.load(tmp_path / "scores.npz")
    assert s["scores"].shape == (256, 256) and "t2i@1" in json.loads(r.stdout)["recall_tevi"]
    # Another encoder's cache is refused: the SAE records the space it was fitted on.
    (test_cache,) = (tiny_run / "stages").glob("embed-[0-9a-f]*/cache/*")
    meta = json.loads((test_cache / "manifest.json").read_text())
    meta["encoder_id"] = "other@0000"
    shutil.copytree(test_cache, tmp_path / "other")  # the store's files are in subdirectories (img_emb/, ...)
    (tmp_path / "other" / "manifest.json").write_text(json.dumps(meta))
    r = _vlctl("fit", "tevi", "--cache", str(tmp_path / "other"), "--sae", str(tmp_path / "sae"), "--out",
               str(tmp_path / "t2"))
    assert r.returncode == 2 and "fitted on embeddings of encoder" in r.stderr, r.stderr
    assert not (tmp_path / "t2").exists()


PAPER = {"sae_init": "concepts", "mask_hidden": 256, "mask_temperature": 1.0, "mask_floor": 0.0, "mask_lr": 1e-2,
         "mask_epochs": 25, "mask_warmup_epochs": 5}


@pytest.mark.parametrize("quick", [True, False])
def test_presets_run_the_paper_configuration(quick):
    # Issue 41: the learned SAE as the paper states it is the headline; the random start and the
    # CG-SAE (the paper's free mask) are reported beside it; the full preset fine-tunes the text tower.
    cfg = tevi_mad.load_preset(quick)
    assert {k: getattr(cfg, k) for k in PAPER} == PAPER
    assert cfg.headline == "learned" and cfg.random_reading and not cfg.cg_group_mask and cfg.text_lr == 1e-6
    assert tevi_mad.fitted_variants(cfg) == ("learned", "cg", "random")
    if not quick:
        assert cfg.text_finetune and cfg.n_seeds == 5


def test_paper_configuration_runs_and_its_word_figures_recompute(tiny_run):
    # Issue 41: the concept-started 26-latent SAE, the paper's mask and schedule, the text tower
    # fine-tuned beside the mask; zero-shot read with the bare value words too.
    import dataclasses

    from vlctl.data.mad import CATEGORIES, captions, load_mad
    from vlctl.data.mad_config import MadConfig
    from vlctl.encoders.factory import load_encoder
    from vlctl.recipes.runner import find_stage

    stages = tiny_run / "stages"
    cfg = dataclasses.replace(TINY, n_seeds=1, contradicting_batches=False, mask_mass_coef=0.0, sae_resample_every=0,
                              cg_group_mask=False, random_reading=False, headline="learned",
                              **{**PAPER, "mask_hidden": 32, "mask_epochs": 2, "mask_warmup_epochs": 1},
                              text_finetune=True, text_lr=1e-3)
    out = tiny_run / "tevi-mad-paper"
    tevi_mad.run(out, cfg=cfg, clip_cfg=TINY_CLIP, stages=stages)
    r = json.loads((out / "results.json").read_text())
    assert r["sae"]["n_latents"] == 26 and r["headline"] == "learned" and set(r["variants"]) == {"learned", "cg"}
    md = (out / "report.md").read_text()  # the learned-SAE table first, the CG-SAE proof under it
    assert md.index("The SAEs side by side") < md.index("Table A2") < md.index("Table A1")
    assert "text tower fine-tuned beside the mask" in md
    learned = r["variants"]["learned"]["summary"]
    z = np.load(out / "arrays" / "conditioning_learned.npz")
    excess = np.mean([editing.conditioning_accuracy(z["original_emb"], z["edited_emb"], z[f"word_{c}"], z[f"label_{c}"],
                                                    z[f"in_caption_{c}"])["not_in_caption"] - 100 / len(z[f"word_{c}"])
                      for c in mad_report.EDITED])
    assert excess == pytest.approx(learned["not_in_caption_excess_words"], abs=1e-9)
    # The fine-tuned tower embeds the test texts: its class texts differ from the frozen CLIP's.
    test_emb = np.load(find_stage(stages, "embed") / "embeddings.npz")
    assert not np.allclose(z["text_color"], test_emb["text_color"])
    # Unchanged, the tower gives the embed stage's texts; the captions are the test split's, unrendered.
    clip = load_encoder(find_stage(stages, "train") / "model")
    labels = load_mad(find_stage(stages, "data-test") / "test")["labels"]
    again = tevi_mad.finetuned_texts(clip.model.text, clip.tokenize, [lab["caption"] for lab in labels])
    for k in ("text_emb", *(f"{p}_{c}" for p in ("text", "word") for c in CATEGORIES)):
        np.testing.assert_allclose(again[k], test_emb[k], atol=1e-5)
    key = mad_clip.split_key(TINY_CLIP, "test")
    assert captions(MadConfig(n=key["n"], seed=key["seed"], split="test")) == [lab["caption"] for lab in labels]
