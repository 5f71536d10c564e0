"""Recipes `controlembed-clevr4`, `controlembed-stanford40`, `controlembed-shotbench`: ControlEmbed
(docs/methods.md §2; paper Tables 1-3) on the real multi-attribute benchmarks, any frozen encoder.

    vlctl reproduce controlembed-clevr4 --encoder open_clip:ViT-L-14/openai --clevr4-root clevr_4_10k_v1/ --out runs/ce-clevr4
    vlctl reproduce controlembed-stanford40 --encoder ... --stanford40-root Stanford40/ --stanford40-labels labels.csv --out ...
    vlctl reproduce controlembed-shotbench --encoder ... --shotbench-tsv ShotBench/test.tsv --out ...

Stages: embed-fit / embed-eval (frozen image embeddings of the fit and evaluation images; subclass
prompt ensembles of every category) -> fit (ONE hypernetwork over every category, the
translation-only ablation, one adapter per attribute) -> evaluate -> report. Splits: Clevr-4 and
Stanford 40 their own (`fit_split` / `eval_split`); ShotBench ships one test file, so its images
are split in two by a seeded permutation (`eval_fraction`), the hypernetwork never sees the
evaluation images. Under torchrun (`vlctl.recipes.runner`) the embedding stages shard the images
over the ranks and every rank fits (each episode's anchors split over the ranks, DDP); rank 0
alone evaluates and reports. The fit stage resumes after a kill: models already saved are kept,
the one in training continues from its checkpoint (in the stage's run/).

Missing labels (ShotBench asks about one or a few categories per image): evaluation uses, per
category, the evaluation images labelled for it; the fit uses the images labelled in every
category kept (ControlEmbed.fit takes one label per image and category).

results.json has the keys of controlembed-shapes (query_map, query_map_mean, cluster_acc,
cluster_acc_mean, zero_shot_transformed, linear_probe, composition, n_test, n_queries, timing,
paper), so reports and figures read both.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
import warnings
from pathlib import Path

import numpy as np

from vlctl.config import config_from_dict, config_to_dict, opt
from vlctl.eval import metrics
from vlctl.fsops import VlctlError
from vlctl.io import atomic_save_npz, atomic_write_json, atomic_write_text, read_json
from vlctl.methods.controlembed.config import DEFAULT_TEMPLATES
from vlctl.recipes.real_common import (
    EncoderRun,
    LazyEncoder,
    data_hash,
    embed_stage,
    estimate_line,
    is_main_rank,
    is_random,
    load_embeddings,
    rank_device,
    report_header,
    say_main,
)
from vlctl.recipes.real_data import LAYOUTS, Clevr4Data, ShotBenchData, Stanford40Data, flag, need_dir, need_file
from vlctl.recipes.runner import Runner
from vlctl.report.writer import Report

METHODS = ("base", "translation_only", "text_projection", "per_attribute", "ours")
COMPOSITION_ALPHA = 0.5
# ControlEmbed paper (CLIP ViT-L/14), per dataset.
PAPER = {
    "clevr4": {"query_map_base": 33.8, "query_map_best_baseline": 49.5, "query_map_ours": 77.0,
               "cluster_acc_base": 48.8, "cluster_acc_ours": 73.0, "best_baseline": "StableRep+",
               "query_map_translation_only": 35.4, "cluster_5000_s": 0.64},
    "stanford40": {"query_map_base": 43.7, "query_map_best_baseline": 49.8, "query_map_ours": 86.3,
                   "cluster_acc_base": 65.2, "cluster_acc_ours": 80.0, "best_baseline": "CWP", "cluster_5000_s": 0.64},
    "shotbench": {"query_map_base": 25.2, "query_map_best_baseline": 23.7, "query_map_ours": 41.0,
                  "cluster_acc_base": 20.8, "cluster_acc_ours": 51.6, "best_baseline": "MaPLe", "cluster_5000_s": 0.64},
}
CLEVR4_CATEGORIES = ("color", "shape", "texture", "count")


@dataclasses.dataclass(frozen=True)
class ControlEmbedRealRecipe:
    parameterisation: str = opt("full", "hypernetwork W: 'full' or 'lowrank'", choices=("full", "lowrank"))
    rank: int = opt(32, "rank r of the 'lowrank' parameterisation", ge=1, le=65536)
    hidden: int = opt(256, "hypernetwork MLP hidden width", ge=1, le=65536)
    hyper_steps: int = opt(2000, "hypernetwork training episodes (one category each)", ge=1, le=10**8)
    hyper_lr: float = opt(1e-3, "hypernetwork learning rate", gt=0, le=10)
    images_per_subclass: int = opt(16, "m: images per subclass in an episode", ge=2, le=4096)
    temperature: float = opt(0.1, "tau of the StableRep and alignment losses", gt=0, le=100)
    align_weight: float = opt(0.1, "omega: weight of the alignment loss (paper: 0.1)", ge=0, le=1000)
    templates: tuple[str, ...] = opt(DEFAULT_TEMPLATES, "prompt templates averaged into each subclass text embedding",
                                     check="template", min_len=1)
    fit_split: str = opt("train", "split the hypernetwork is fitted on (Clevr-4, Stanford 40)")
    eval_split: str = opt("test", "split it is evaluated on (Clevr-4: 'test' or 'val' as the annotations name it)")
    eval_fraction: float = opt(0.5, "ShotBench: fraction of images held out for evaluation", gt=0, lt=1)
    n_queries: int = opt(1000, "evaluation images used as queries per category (gallery: all of them)", ge=1, le=10**7)
    kmeans_n_init: int = opt(1, "k-means restarts per clustering", ge=1, le=1000)
    seed: int = opt(0, "seed of the fits, the ShotBench split and k-means", ge=0, le=2**32 - 1)


def load_preset(quick: bool) -> ControlEmbedRealRecipe:
    path = Path(__file__).with_name("controlembed-real.json")
    return config_from_dict(ControlEmbedRealRecipe, read_json(path)["quick" if quick else "full"], source=str(path))


@dataclasses.dataclass
class Labelled:
    """Images (file paths) and their labels per category (None: not labelled)."""

    paths: list[Path]
    labels: dict[str, list[str | None]]
    files: list[Path]  # annotation files (hashed into the stage key)


# --- datasets ------------------------------------------------------------------------------------


def _clevr4(data: Clevr4Data, cfg: ControlEmbedRealRecipe) -> tuple[Labelled, Labelled]:
    from vlctl.data.loaders.folder import load_clevr4

    root = need_dir(data.clevr4_root, flag("clevr4_root"), "clevr4")
    if not (root / "clevr_4_annots.json").is_file():
        raise VlctlError(f"{root}: no clevr_4_annots.json in the Clevr-4 root ({flag('clevr4_root')}); expected "
                         f"{LAYOUTS['clevr4']}")

    def split(name: str) -> Labelled:
        d = load_clevr4(root, split=name)
        cats = [c for c in CLEVR4_CATEGORIES if any(c in f for f in d.image_fields)]
        if not cats:
            raise VlctlError(f"{root / 'clevr_4_annots.json'}: no taxonomy among {list(CLEVR4_CATEGORIES)} in the labels")
        labels = {c: [None if f.get(c) is None else str(f[c]) for f in d.image_fields] for c in cats}
        return Labelled(d.image_paths(), labels, [root / "clevr_4_annots.json"])

    return split(cfg.fit_split), split(cfg.eval_split)


def _stanford40(data: Stanford40Data, cfg: ControlEmbedRealRecipe) -> tuple[Labelled, Labelled]:
    from vlctl.data.loaders.labelled import load_stanford40

    root = need_dir(data.stanford40_root, flag("stanford40_root"), "stanford40")
    labels = need_file(data.stanford40_labels, flag("stanford40_labels"), "stanford40") if data.stanford40_labels else None

    def split(name: str) -> Labelled:
        d = load_stanford40(root, split=name, labels=labels)
        files = [root / "ImageSplits" / f"{name}.txt"] + ([labels] if labels else [])
        return Labelled([root / p for p in d.images], dict(d.labels), files)

    return split(cfg.fit_split), split(cfg.eval_split)


def _shotbench(data: ShotBenchData, cfg: ControlEmbedRealRecipe, unpack: Path) -> tuple[Labelled, Labelled]:
    from vlctl.data.loaders.labelled import load_shotbench

    tsv = need_file(data.shotbench_tsv, flag("shotbench_tsv"), "shotbench")
    root = need_dir(data.shotbench_root, flag("shotbench_root"), "shotbench") if data.shotbench_root else None
    d = load_shotbench(tsv, root=root)
    paths = d.write_images(unpack) if d.embedded else [Path(d.image_source(i)) for i in range(d.n_images)]
    order = np.random.default_rng(cfg.seed).permutation(d.n_images)
    n_eval = max(1, round(cfg.eval_fraction * d.n_images))
    ev, fit = np.sort(order[:n_eval]), np.sort(order[n_eval:])

    def part(rows: np.ndarray) -> Labelled:
        return Labelled([paths[i] for i in rows], {c: [v[i] for i in rows] for c, v in d.labels.items()}, [tsv])

    return part(fit), part(ev)


# --- stages --------------------------------------------------------------------------------------


def _values(fit: Labelled, ev: Labelled) -> dict[str, list[str]]:
    """Every subclass of each category (fit and evaluation images), sorted."""
    return {c: sorted({v for v in fit.labels[c] + ev.labels.get(c, []) if v is not None}) for c in fit.labels}


def _texts(encoder, values: dict[str, list[str]], templates) -> dict[str, np.ndarray]:
    import torch

    from vlctl.methods.controlembed.prompts import prompt_ensemble

    def encode(texts: list[str]) -> np.ndarray:
        with torch.inference_mode():
            return encoder.encode_texts(encoder.tokenize(texts)).float().cpu().numpy()

    return {c: prompt_ensemble(encode, vals, templates) for c, vals in values.items()}


def _fit_rows(fit: Labelled) -> tuple[np.ndarray, list[str], list[str]]:
    """(rows labelled in at least one kept category, kept categories, dropped categories with why).

    A category is kept when its own labelled images hold >= 2 subclasses of >= 2 images; an image
    without a label in some category sits out that category's episodes (`ControlEmbed.fit` takes
    None as "no label"), so partly labelled datasets (Stanford 40's poses, ShotBench) keep them all."""
    cats, dropped = [], []
    for c, labels in fit.labels.items():
        _, counts = np.unique([v for v in labels if v is not None], return_counts=True)
        if len(counts) >= 2 and counts.min() >= 2:
            cats.append(c)
        else:
            dropped.append(f"{c}: too few labelled images (needs >= 2 subclasses of >= 2 images)")
    if not cats:
        raise VlctlError("ControlEmbed fit: no category has >= 2 subclasses of >= 2 labelled images among the fit images")
    rows = np.flatnonzero([any(fit.labels[c][i] is not None for c in cats) for i in range(len(fit.paths))])
    return rows, cats, dropped


def _fit(cfg: ControlEmbedRealRecipe, emb: dict, fit: Labelled, encoder_id: str, device: str, work: Path,
         resume: bool = False) -> None:
    """The fit stage: every model into work/<name>/, each fit checkpointed in work/run/<name>/.

    Under torchrun every rank fits (data-parallel, `ControlEmbed.fit`); rank 0 writes. Resumed
    (`resume`, the stage's .partial/ from a killed run), a model already saved is kept and the
    one that was training continues from its last checkpoint."""
    from vlctl.methods.controlembed.estimator import ControlEmbed
    from vlctl.methods.controlembed.fit import checkpoint_ranks
    from vlctl.train.distributed import all_gather_object, barrier, rank_and_world

    rows, cats, dropped = _fit_rows(fit)
    x = emb["image_emb"][rows]
    y = {c: np.array([fit.labels[c][i] for i in rows], dtype=object) for c in cats}
    values = {c: list(emb[f"values_{c}"]) for c in cats}
    text = {c: emb[f"text_{c}"][[values[c].index(v) for v in np.unique([v for v in y[c] if v is not None])]]
            for c in cats}
    common = {"hidden": cfg.hidden, "rank": cfg.rank, "temperature": cfg.temperature, "align_weight": cfg.align_weight,
              "images_per_subclass": cfg.images_per_subclass, "lr": cfg.hyper_lr, "seed": cfg.seed, "device": device}
    plan = [("ours", cats, cfg.hyper_steps, cfg.parameterisation),
            ("translation_only", cats, cfg.hyper_steps, "translation")]
    plan += [(f"per_attribute_{c}", [c], max(1, cfg.hyper_steps // len(cats)), cfg.parameterisation) for c in cats]
    # Rank 0's view of what a killed run finished (fit_time.json is written last), for every rank:
    # the ranks must run the same fits.
    saved = all_gather_object(sorted(name for name, *_ in plan if (work / name / "fit_time.json").is_file())
                              if resume else [])[0]

    def one(name: str, cs: list[str], steps: int, parameterisation: str) -> None:
        run = work / "run" / name
        every = max(1, steps // 10)  # about ten checkpoints a fit (a checkpoint keeps the open log window)
        # Rank 0 decides for all: resume the fit's checkpoint if it has one, of as many ranks as now
        # (the fit refuses another number; that one fit then starts over, the stage still resumes).
        ranks = all_gather_object(checkpoint_ranks(run / "checkpoint") if resume and is_main_rank() else None)[0]
        again = ranks == rank_and_world()[1]
        if ranks is not None and not again:
            say_main(f"stage fit: {name}: its checkpoint is of {ranks} ranks, this run has {rank_and_world()[1]}; "
                     "fitting it again")
            if is_main_rank():
                shutil.rmtree(run)
            barrier()
        t0 = time.perf_counter()
        model = ControlEmbed(parameterisation=parameterisation, steps=steps, out_dir=run, **common)
        model.fit(x, {c: y[c] for c in cs}, encoder_id=encoder_id, class_text_emb={c: text[c] for c in cs},
                  checkpoint_every=every, resume=again)
        if not is_main_rank():  # under torchrun every rank fits (DDP); rank 0 writes
            return
        model.save(work / name)
        atomic_write_json(work / name / "fit_time.json", {"seconds": time.perf_counter() - t0, "steps": steps,
                                                          "resumed": again})
        shutil.rmtree(run / "checkpoint")  # the saved model replaces it (its log.jsonl stays)

    if not saved:  # a first start: time a few steps for the estimate (a resumed stage has had it)
        probe = min(20, cfg.hyper_steps)
        t0 = time.perf_counter()
        ControlEmbed(parameterisation=cfg.parameterisation, steps=probe, **common).fit(
            x, y, encoder_id=encoder_id, class_text_emb=text)
        rate = probe / max(time.perf_counter() - t0, 1e-9)
        total = sum(steps for *_, steps, _ in plan)
        d = x.shape[1]
        estimate_line("stage fit", total, rate, 16 * cfg.hidden * (d * d + d) + x.nbytes, unit="steps")
    for name, cs, steps, parameterisation in plan:
        if name not in saved:
            one(name, cs, steps, parameterisation)
    if is_main_rank():
        atomic_write_json(work / "fit.json", {"categories": cats, "dropped": dropped, "n_fit": len(rows)})


# --- evaluation ----------------------------------------------------------------------------------


def _index(labels: list[str | None], values: list[str]) -> np.ndarray:
    pos = {v: i for i, v in enumerate(values)}
    return np.array([pos[v] if v is not None else -1 for v in labels], dtype=np.int64)


def evaluate(cfg: ControlEmbedRealRecipe, fit_emb: dict, ev_emb: dict, fit: Labelled, ev: Labelled, fit_dir: Path,
             out: Path) -> dict:
    from vlctl.methods.controlembed.estimator import ControlEmbed, kmeans_labels, normalize_rows
    from vlctl.methods.controlembed.prompts import text_subspace_projection
    from vlctl.recipes.controlembed.shapes import cluster_5000_seconds, linear_probe, query_map

    info = read_json(fit_dir / "fit.json")
    cats = info["categories"]
    ours, trans = ControlEmbed.load(fit_dir / "ours"), ControlEmbed.load(fit_dir / "translation_only")
    per_attr = {c: ControlEmbed.load(fit_dir / f"per_attribute_{c}") for c in cats}
    g_all = normalize_rows(ev_emb["image_emb"])
    qmap, cacc, zshot, probe, affines, arrays, n_test = {}, {}, {}, {}, {}, {}, {}
    for c in cats:
        values = list(fit_emb[f"values_{c}"])
        y_all = _index(ev.labels[c], values)
        rows = np.flatnonzero(y_all >= 0)
        g, y = g_all[rows], y_all[rows]
        nq = min(cfg.n_queries, len(g))
        q = g[:nq]
        w, b = ours.affine(c)
        affines[c] = (w, b)
        wp, bp = text_subspace_projection(fit_emb[f"text_{c}"])
        qmap[c] = {"base": query_map(q, g, y, nq), "translation_only": query_map(trans.transform(q, c), g, y, nq),
                   "text_projection": query_map(q @ wp + bp, g, y, nq),
                   "per_attribute": query_map(per_attr[c].transform(q, c), g, y, nq),
                   "ours": query_map(q @ w + b, g, y, nq)}
        k = len(np.unique(y))
        cacc[c] = {"base": metrics.cluster_accuracy(y, kmeans_labels(g, k, cfg.seed, cfg.kmeans_n_init)),
                   "ours": metrics.cluster_accuracy(y, kmeans_labels(normalize_rows(g @ w + b), k, cfg.seed,
                                                                       cfg.kmeans_n_init))}
        zshot[c] = {"base": metrics.zero_shot_accuracy(g, fit_emb[f"text_{c}"], y),
                    "ours": metrics.zero_shot_accuracy(g @ w + b, fit_emb[f"text_{c}"], y)}
        y_fit = _index(fit.labels[c], values)
        fr = np.flatnonzero(y_fit >= 0)
        probe[c] = (linear_probe(fit_emb["image_emb"][fr], y_fit[fr], ev_emb["image_emb"][rows], y)
                    if len(np.unique(y_fit[fr])) >= 2 else None)
        n_test[c] = len(rows)
        arrays.update({f"rows_{c}": rows, f"label_{c}": y, f"W_{c}": w, f"b_{c}": b, f"text_{c}": fit_emb[f"text_{c}"],
                       f"n_queries_{c}": np.array(nq)})
    composition = {}
    for i, a in enumerate(cats):
        for bc in cats[i + 1:]:
            ya, yb = _index(ev.labels[a], list(fit_emb[f"values_{a}"])), _index(ev.labels[bc], list(fit_emb[f"values_{bc}"]))
            rows = np.flatnonzero((ya >= 0) & (yb >= 0))
            if len(rows) < 2:
                continue
            g, both = g_all[rows], ya[rows] * 1000 + yb[rows]
            nq = min(cfg.n_queries, len(g))
            q = g[:nq]
            (wa, ba), (wb, bb) = affines[a], affines[bc]
            composition[f"{a}+{bc}"] = {
                "base": query_map(q, g, both, nq), a: query_map(q @ wa + ba, g, both, nq),
                bc: query_map(q @ wb + bb, g, both, nq),
                "blend": query_map(COMPOSITION_ALPHA * (q @ wa + ba) + (1 - COMPOSITION_ALPHA) * (q @ wb + bb), g, both,
                                   nq)}
    atomic_save_npz(out / "arrays" / "controlembed.npz", gallery_emb=g_all.astype(np.float32), **arrays)
    atomic_write_text(out / "arrays" / "README.md", ARRAYS_README)
    d = g_all.shape[1]
    return {
        "categories": cats, "dropped_categories": info["dropped"], "n_fit": info["n_fit"],
        "query_map": qmap, "query_map_mean": {m: float(np.mean([qmap[c][m] for c in cats])) for m in METHODS},
        "cluster_acc": cacc, "cluster_acc_mean": {m: float(np.mean([cacc[c][m] for c in cats])) for m in ("base", "ours")},
        "zero_shot_transformed": zshot, "linear_probe": probe, "composition": composition,
        "n_test": len(g_all), "n_test_by_category": n_test, "n_queries": min(cfg.n_queries, len(g_all)),
        "timing": {"cluster_5000_s": cluster_5000_seconds(768, n_init=cfg.kmeans_n_init, seed=cfg.seed),
                   "cluster_5000_s_at_our_d": cluster_5000_seconds(d, n_init=cfg.kmeans_n_init, seed=cfg.seed),
                   "fit_s": {p.name: read_json(p / "fit_time.json")["seconds"] for p in sorted(fit_dir.iterdir())
                             if (p / "fit_time.json").is_file()}},
    }


ARRAYS_README = """# arrays/

`controlembed.npz`: `gallery_emb` (N, D) L2-normalised evaluation-image embeddings; per category
c: `rows_c` the gallery rows labelled for c, `label_c` their subclass index (into the sorted
subclass names), `W_c` (D, D), `b_c` (D,) the hypernetwork's map, `text_c` (K, D) the subclass
prompt-ensemble text embeddings, `n_queries_c`. With g = gallery_emb[rows_c], q = g[:n]:
`query_map[c]["ours"] = mean_average_precision((q @ W_c + b_c) @ g.T, label_c[:n], label_c, ignore)`
(ignore[i, i]: a query is not its own result), "base" with q @ g.T;
`cluster_acc[c]["ours"] = cluster_accuracy(label_c, kmeans(normalize(g @ W_c + b_c), K))`;
`zero_shot_transformed[c]["ours"] = zero_shot_accuracy(g @ W_c + b_c, text_c, label_c)`.
"""


def _report(name: str, r: dict) -> Report:
    paper = PAPER[name]
    rep = Report(f"controlembed-{name}: text-conditioned affine maps of a frozen space")
    report_header(rep, r["encoder_id"], r["encoder_spec"])
    rep.text(f"One hypernetwork over the categories {', '.join(r['categories'])}, fitted on {r['n_fit']} images; "
             f"evaluated on {r['n_test']} held-out images. Paper: CLIP ViT-L/14. Percentages; arrays/README.md says "
             "how to recompute them.")
    if r["dropped_categories"]:
        rep.text("Categories left out of the fit: " + "; ".join(r["dropped_categories"]))
    rep.heading("Attribute-aware retrieval (query mAP)")
    rows = [[c, *[r["query_map"][c][m] for m in METHODS]] for c in r["categories"]]
    rows.append(["mean", *[r["query_map_mean"][m] for m in METHODS]])
    rows.append(["paper", paper["query_map_base"], paper.get("query_map_translation_only"), None, None,
                 paper["query_map_ours"]])
    rep.table(["category", *METHODS], rows)
    rep.text(f"The paper's best baseline on this dataset, {paper['best_baseline']}: {paper['query_map_best_baseline']} "
             "mAP. text_projection is the training-free CWP/LCR family; per_attribute one adapter per attribute.")
    rep.heading("Clustering accuracy (k-means, Hungarian-matched)")
    rows = [[c, r["cluster_acc"][c]["base"], r["cluster_acc"][c]["ours"]] for c in r["categories"]]
    rows.append(["mean", r["cluster_acc_mean"]["base"], r["cluster_acc_mean"]["ours"]])
    rows.append(["paper", paper["cluster_acc_base"], paper["cluster_acc_ours"]])
    rep.table(["category", "base", "ours"], rows)
    t = r["timing"]
    rep.text(f"Transform + k-means + Hungarian for 5,000 images: {t['cluster_5000_s']:.3f} s at D = 768, "
             f"{t['cluster_5000_s_at_our_d']:.3f} s at our D (paper: {paper['cluster_5000_s']} s).")
    rep.heading("Text-based zero-shot classification and linear probe")
    rep.table(["category", "zero-shot base", "zero-shot ours", "linear probe"],
              [[c, r["zero_shot_transformed"][c]["base"], r["zero_shot_transformed"][c]["ours"], r["linear_probe"][c]]
               for c in r["categories"]])
    if r["composition"]:
        rep.heading(f"Composition (alpha = {COMPOSITION_ALPHA})")
        rep.table(["pair", "base", "first only", "second only", "blend"],
                  [[p, v["base"], v[p.split("+")[0]], v[p.split("+")[1]], v["blend"]] for p, v in r["composition"].items()])
    rep.timings(r["timings"])
    return rep


def _run(name: str, out: Path, quick: bool, force: bool, stages, encoder: str | None, data, cfg, encoder_run,
         from_scratch: bool = False) -> Path:
    # No shipped checkpoints exist for the real recipes; from_scratch is passed on for the runner's contract.
    runner = Runner(out, force=force, stages=stages, from_scratch=from_scratch,
                    device=(encoder_run or EncoderRun()).device, torchrun=True)
    if not encoder:
        raise VlctlError(f"controlembed-{name}: --encoder SPEC is required (open_clip:..., hf:..., tiny:DIR)")
    cfg = cfg or load_preset(quick)
    run_cfg = encoder_run or EncoderRun()
    out = Path(out)
    t_start = time.perf_counter()
    with runner.measure("data"):  # reading the annotations
        if name == "clevr4":
            fit, ev = _clevr4(data or Clevr4Data(), cfg)
        elif name == "stanford40":
            fit, ev = _stanford40(data or Stanford40Data(), cfg)
        else:
            fit, ev = _shotbench(data or ShotBenchData(), cfg, runner.stages / "shotbench-images")
    lazy = LazyEncoder(encoder, run_cfg)
    values = _values(fit, ev)
    texts: dict[str, np.ndarray] = {}

    def text_arrays() -> dict[str, np.ndarray]:
        if not texts:
            texts.update(_texts(lazy.get(), values, cfg.templates))
        return {**{f"text_{c}": t for c, t in texts.items()}, **{f"values_{c}": np.array(v) for c, v in values.items()}}

    fit_key = {"dataset": name, "data": data_hash(fit.files, [str(p) for p in fit.paths], None),
               "labels": data_hash([], [f"{c}={v}" for c, vs in fit.labels.items() for v in vs], None),
               "templates": list(cfg.templates), "values": values}
    # The subclass prompt ensembles are part of the fit stage (same encoder, same key).
    fit_stage = embed_stage(runner, "embed-fit", lazy, fit_key, fit.paths, [], run_cfg, extra=text_arrays)
    ev_key = {"dataset": name, "data": data_hash(ev.files, [str(p) for p in ev.paths], None)}
    ev_stage = embed_stage(runner, "embed-eval", lazy, ev_key, ev.paths, [], run_cfg)
    fit_emb = load_embeddings(fit_stage)
    ev_emb = load_embeddings(ev_stage)
    encoder_id = read_json(fit_stage / "encoder.json")["encoder_id"]
    hyper = ("parameterisation", "rank", "hidden", "hyper_steps", "hyper_lr", "images_per_subclass", "temperature",
             "align_weight")
    # Under torchrun every rank fits (each episode's anchors split over the ranks); a killed fit
    # resumes from its checkpoint. Then the ranks part: rank 0 evaluates and reports alone.
    fit_dir = runner.stage("fit", {"embed": fit_stage.name, **{f: getattr(cfg, f) for f in hyper}},
                           lambda w, resume: _fit(cfg, fit_emb, fit, encoder_id, rank_device(run_cfg.device), w,
                                                  resume),
                           resumable=True, distributed=True)
    if not runner.leave():
        return out / "report.md"
    with runner.measure("evaluate"), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # sklearn / k-means chatter on tiny fixtures
        res = evaluate(cfg, fit_emb, ev_emb, fit, ev, fit_dir, out)
    results = {"recipe": f"controlembed-{name}", "quick": quick, "config": config_to_dict(cfg),
               "data": config_to_dict(data) if data is not None else None, "encoder_run": config_to_dict(run_cfg),
               "encoder_id": encoder_id, "encoder_spec": lazy.canonical_spec, "random_weights": is_random(encoder_id),
               "paper": PAPER[name], **res}
    results["timings"] = {**runner.timings, "total_seconds": time.perf_counter() - t_start}
    atomic_write_json(out / "results.json", results)
    _report(name, results).write(out)
    return out / "report.md"


def run_clevr4(out: Path, quick: bool = False, force: bool = False, stages=None, from_scratch: bool = False, *,
               encoder: str | None = None, data: Clevr4Data | None = None, cfg: ControlEmbedRealRecipe | None = None,
               encoder_run: EncoderRun | None = None) -> Path:
    return _run("clevr4", out, quick, force, stages, encoder, data, cfg, encoder_run, from_scratch)


def run_stanford40(out: Path, quick: bool = False, force: bool = False, stages=None, from_scratch: bool = False, *,
                   encoder: str | None = None, data: Stanford40Data | None = None,
                   cfg: ControlEmbedRealRecipe | None = None, encoder_run: EncoderRun | None = None) -> Path:
    return _run("stanford40", out, quick, force, stages, encoder, data, cfg, encoder_run, from_scratch)


def run_shotbench(out: Path, quick: bool = False, force: bool = False, stages=None, from_scratch: bool = False, *,
                  encoder: str | None = None, data: ShotBenchData | None = None,
                  cfg: ControlEmbedRealRecipe | None = None, encoder_run: EncoderRun | None = None) -> Path:
    return _run("shotbench", out, quick, force, stages, encoder, data, cfg, encoder_run, from_scratch)
