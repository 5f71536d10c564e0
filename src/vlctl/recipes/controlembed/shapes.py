"""Recipe `controlembed-shapes`: ControlEmbed (docs/methods.md §2) on the Clevr-4-like shapes set.

Stages: data (train + test shapes) -> train (TinyCLIP from scratch on the shapes captions) ->
embed (train and test images; subclass prompt ensembles) -> fit (the hypernetwork; the
translation-only ablation; one adapter per attribute; a hypernetwork with held-out subclasses)
-> evaluate -> report. Every number of results.json is computed from the cached arrays with
`vlctl.eval.metrics`, and the headline ones are recomputable from arrays/controlembed.npz.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from pathlib import Path

import numpy as np

from vlctl.config import config_from_dict, config_to_dict, opt
from vlctl.data.shapes import (
    CATEGORIES,
    VALUES,
    ShapesConfig,
    generate_shapes,
    label_indices,
    load_shapes,
    subclass_phrase,
)
from vlctl.eval import metrics
from vlctl.eval.probe import linear_probe as probe_predictions
from vlctl.io import atomic_save_npz, atomic_write_json, atomic_write_text, read_json
from vlctl.methods.controlembed.config import DEFAULT_TEMPLATES
from vlctl.methods.controlembed.estimator import ControlEmbed, UntrainedAttributeWarning, kmeans_labels, normalize_rows
from vlctl.methods.controlembed.prompts import prompt_ensemble, text_subspace_projection
from vlctl.recipes.runner import Runner
from vlctl.report.writer import Report

# ControlEmbed paper (CLIP ViT-L/14 on Clevr-4): Tables 1, 2, 3 and 8 (docs/methods.md §2).
PAPER = {
    "query_map_base": 33.8, "query_map_ours": 77.0, "query_map_best_baseline": 49.5,
    "query_map_cwp": 43.8, "query_map_translation_only": 35.4,
    "cluster_acc_base": 48.8, "cluster_acc_ours": 73.0, "cluster_5000_s": 0.64,
    "text_classification_ours": 88.7, "text_classification_without_alignment": 71.7,
}
# Paraphrases of the category names for the generalisation test (never seen in training).
PARAPHRASES = {"color": "hue", "texture": "surface pattern", "count": "how many", "shape": "form"}
COMPOSITION_ALPHA = 0.5
METHODS = ("base", "translation_only", "text_projection", "per_attribute", "ours")


@dataclasses.dataclass(frozen=True)
class ControlEmbedShapesRecipe:
    n_train: int = opt(20000, "training images (TinyCLIP and the hypernetwork)", ge=1, le=10**7)
    n_test: int = opt(5000, "test images: the gallery of retrieval and the set that is clustered", ge=1, le=10**7)
    image_size: int = opt(32, "image side in pixels (the TinyCLIP config's image_size)", ge=16, le=1024)
    model: str = opt("shapes-quick", "TinyCLIP config name")
    epochs: int = opt(10, "TinyCLIP training epochs", ge=1, le=100_000)
    batch_size: int = opt(128, "TinyCLIP global batch size", ge=1, le=65536)
    lr: float = opt(2e-3, "TinyCLIP peak learning rate", gt=0, le=10)
    temperature_lr: float = opt(1e-2, "TinyCLIP learnable temperature's learning rate", ge=0, le=10)
    warmup_steps: int = opt(100, "TinyCLIP linear warmup steps", ge=0, le=10**9)
    weight_decay: float = opt(0.1, "TinyCLIP AdamW weight decay (matrices only)", ge=0, le=10)
    procs: int = opt(1, "TinyCLIP CPU training processes (torchrun DDP when > 1; one per GPU under CUDA)", ge=1, le=256)
    threads: int = opt(0, "torch threads of in-process TinyCLIP training (0 = leave as is)", ge=0, le=1024)
    parameterisation: str = opt("full", "hypernetwork W: 'full' or 'lowrank'", choices=("full", "lowrank"))
    rank: int = opt(32, "rank r of the 'lowrank' parameterisation", ge=1, le=65536)
    hidden: int = opt(256, "hypernetwork MLP hidden width", ge=1, le=65536)
    hyper_steps: int = opt(2000, "hypernetwork training episodes (one category each)", ge=1, le=10**8)
    hyper_lr: float = opt(1e-3, "hypernetwork learning rate", gt=0, le=10)
    images_per_subclass: int = opt(16, "m: images per subclass in an episode (class-balanced sampler)", ge=2, le=4096)
    temperature: float = opt(0.1, "tau of the StableRep and alignment losses", gt=0, le=100)
    align_weight: float = opt(0.1, "omega: weight of the i2t + t2i alignment loss", ge=0, le=1000)
    templates: tuple[str, ...] = opt(DEFAULT_TEMPLATES, "prompt templates averaged into each subclass text embedding",
                                     check="template", min_len=1)
    heldout_per_category: int = opt(2, "subclasses per category held out of training for the generalisation test",
                                    ge=0, le=1000)
    n_queries: int = opt(1000, "test images used as retrieval queries (the gallery is all test images)", ge=1, le=10**7)
    kmeans_n_init: int = opt(1, "k-means restarts (k-means++ init) per clustering", ge=1, le=1000)
    seed: int = opt(0, "seed for data, training and k-means", ge=0, le=2**32 - 1)


def load_preset(quick: bool) -> ControlEmbedShapesRecipe:
    path = Path(__file__).with_name("controlembed-shapes.json")
    return config_from_dict(ControlEmbedShapesRecipe, read_json(path)["quick" if quick else "full"], source=str(path))


# --- stages --------------------------------------------------------------------------------------


def _train(cfg: ControlEmbedShapesRecipe, data_dir: Path, work: Path, resume: bool) -> None:
    from vlctl.train.clip import launch_clip_training
    from vlctl.train.config import ClipTrainConfig, LoopConfig

    # No shift augmentation: np.roll would wrap objects across the border and change the count.
    clip = ClipTrainConfig(model=cfg.model, temperature_lr=cfg.temperature_lr, shift_pixels=0)
    loop = LoopConfig(epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr, weight_decay=cfg.weight_decay,
                      warmup_steps=cfg.warmup_steps, seed=cfg.seed, threads=cfg.threads,
                      checkpoint_every=500, progress=False, log_every=20)
    launch_clip_training(data_dir, work, clip, loop, cfg.procs, resume)


def _embed(cfg: ControlEmbedShapesRecipe, encoder_dir: Path, data_dir: Path, work: Path) -> None:
    from vlctl.data.mad import mad_dataset_id
    from vlctl.embeddings.cache import embed
    from vlctl.encoders.factory import load_encoder

    encoder = load_encoder(encoder_dir)
    arrays = {}
    for split in ("train", "test"):
        cache = embed(encoder, images=load_shapes(data_dir / split)["images"], data_id=mad_dataset_id(data_dir / split),
                      root=work / "cache", progress=False)
        arrays[f"{split}_emb"] = np.asarray(cache.image_emb)

    def encode_texts(texts: list[str]) -> np.ndarray:
        import torch

        with torch.inference_mode():
            return encoder.encode_texts(encoder.tokenize(texts)).numpy()

    for c in CATEGORIES:
        arrays[f"text_{c}"] = prompt_ensemble(encode_texts, [subclass_phrase(c, v) for v in VALUES[c]], cfg.templates)
    atomic_save_npz(work / "embeddings.npz", **arrays)
    atomic_write_json(work / "encoder.json", {"encoder_id": encoder.id})


def _labels(labels: list[dict]) -> dict[str, np.ndarray]:
    return {c: label_indices(labels, c) for c in CATEGORIES}


def heldout_subclasses(cfg: ControlEmbedShapesRecipe) -> dict[str, list[int]]:
    """The subclass indices of each category held out of the generalisation model's training."""
    rng = np.random.default_rng([cfg.seed, 7])
    return {c: sorted(rng.choice(len(VALUES[c]), cfg.heldout_per_category, replace=False).tolist()) for c in CATEGORIES}


def _fit(cfg: ControlEmbedShapesRecipe, emb_dir: Path, data_dir: Path, work: Path) -> None:
    emb = np.load(emb_dir / "embeddings.npz")
    encoder_id = read_json(emb_dir / "encoder.json")["encoder_id"]
    x, y = emb["train_emb"], _labels(load_shapes(data_dir / "train")["labels"])
    text = {c: emb[f"text_{c}"] for c in CATEGORIES}
    common = {"hidden": cfg.hidden, "rank": cfg.rank, "temperature": cfg.temperature, "align_weight": cfg.align_weight,
              "images_per_subclass": cfg.images_per_subclass, "lr": cfg.hyper_lr, "seed": cfg.seed}

    def fit(name: str, rows: np.ndarray, cats: tuple[str, ...], steps: int, parameterisation: str) -> None:
        t0 = time.perf_counter()
        model = ControlEmbed(parameterisation=parameterisation, steps=steps, **common)
        model.fit(x[rows], {c: y[c][rows] for c in cats}, encoder_id=encoder_id,
                  class_text_emb={c: _subset_text(text[c], y[c][rows]) for c in cats})
        model.save(work / name)
        atomic_write_json(work / name / "fit_time.json", {"seconds": time.perf_counter() - t0})

    everything = np.arange(len(x))
    fit("ours", everything, CATEGORIES, cfg.hyper_steps, cfg.parameterisation)
    fit("translation_only", everything, CATEGORIES, cfg.hyper_steps, "translation")
    # One model per attribute with the same loss; each sees as many episodes of its category as
    # the shared model does.
    for c in CATEGORIES:
        fit(f"per_attribute_{c}", everything, (c,), max(1, cfg.hyper_steps // len(CATEGORIES)), cfg.parameterisation)
    held = heldout_subclasses(cfg)
    keep = np.all([~np.isin(y[c], held[c]) for c in CATEGORIES], axis=0)
    fit("heldout", np.flatnonzero(keep), CATEGORIES, cfg.hyper_steps, cfg.parameterisation)


def _subset_text(text: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Rows of the subclasses present in y, in sorted order (what ControlEmbed.fit expects)."""
    return text[np.unique(y)]


# --- evaluation ----------------------------------------------------------------------------------


def query_map(query: np.ndarray, gallery: np.ndarray, labels: np.ndarray, n_queries: int) -> float:
    """mAP of the first n_queries gallery items as queries (scores query . gallery), self excluded."""
    scores = query @ gallery.T
    ignore = np.zeros(scores.shape, dtype=bool)
    ignore[np.arange(n_queries), np.arange(n_queries)] = True
    return metrics.mean_average_precision(scores, labels[:n_queries], labels, ignore=ignore)


def cluster_5000_seconds(d: int, k: int = 10, n: int = 5000, n_init: int = 1, seed: int = 0) -> float:
    """Wall time of transform + normalise + k-means + Hungarian matching for n random D-dim
    embeddings under a random affine map (the cost does not depend on what the map learned)."""
    rng = np.random.default_rng(seed)
    g = normalize_rows(rng.normal(size=(n, d)).astype(np.float32))
    w = (np.eye(d) + 0.1 * rng.normal(size=(d, d))).astype(np.float32)
    b = (0.1 * rng.normal(size=d)).astype(np.float32)
    y = rng.integers(0, k, n)
    kmeans_labels(g[:100], 2, seed)  # import scikit-learn outside the timing
    t0 = time.perf_counter()
    pred = kmeans_labels(normalize_rows(g @ w + b), k, seed, n_init)
    metrics.cluster_accuracy(y, pred)
    return time.perf_counter() - t0


def linear_probe(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray) -> float:
    """Test accuracy (%) of a multinomial logistic regression (C = 10) on frozen embeddings."""
    return 100.0 * float((probe_predictions(train_x, train_y, test_x, C=10.0) == test_y).mean())


def evaluate(cfg: ControlEmbedShapesRecipe, emb_dir: Path, fit_dir: Path, data_dir: Path, out: Path) -> dict:
    emb = np.load(emb_dir / "embeddings.npz")
    g = normalize_rows(emb["test_emb"])
    y = _labels(load_shapes(data_dir / "test")["labels"])
    y_train = _labels(load_shapes(data_dir / "train")["labels"])
    nq = min(cfg.n_queries, len(g))
    q = g[:nq]
    ours = ControlEmbed.load(fit_dir / "ours")
    trans = ControlEmbed.load(fit_dir / "translation_only")
    per_attr = {c: ControlEmbed.load(fit_dir / f"per_attribute_{c}") for c in CATEGORIES}
    held_model = ControlEmbed.load(fit_dir / "heldout")

    qmap, cacc, zshot, probe, affines = {}, {}, {}, {}, {}
    for c in CATEGORIES:
        w, b = ours.affine(c)
        affines[c] = (w, b)
        wp, bp = text_subspace_projection(emb[f"text_{c}"])
        qmap[c] = {
            "base": query_map(q, g, y[c], nq),
            "translation_only": query_map(trans.transform(q, c), g, y[c], nq),
            "text_projection": query_map(q @ wp + bp, g, y[c], nq),
            "per_attribute": query_map(per_attr[c].transform(q, c), g, y[c], nq),
            "ours": query_map(q @ w + b, g, y[c], nq),
        }
        k = len(VALUES[c])
        cacc[c] = {
            "base": metrics.cluster_accuracy(y[c], kmeans_labels(g, k, cfg.seed, cfg.kmeans_n_init)),
            "ours": metrics.cluster_accuracy(y[c], kmeans_labels(normalize_rows(g @ w + b), k, cfg.seed, cfg.kmeans_n_init)),
        }
        zshot[c] = {"base": metrics.zero_shot_accuracy(g, emb[f"text_{c}"], y[c]),
                    "ours": metrics.zero_shot_accuracy(g @ w + b, emb[f"text_{c}"], y[c])}
        probe[c] = linear_probe(emb["train_emb"], y_train[c], emb["test_emb"], y[c])

    composition = {}
    for i, a in enumerate(CATEGORIES):
        for bcat in CATEGORIES[i + 1:]:
            both = y[a] * 100 + y[bcat]
            (wa, ba), (wb, bb) = affines[a], affines[bcat]
            composition[f"{a}+{bcat}"] = {
                "base": query_map(q, g, both, nq),
                a: query_map(q @ wa + ba, g, both, nq),
                bcat: query_map(q @ wb + bb, g, both, nq),
                "blend": query_map(COMPOSITION_ALPHA * (q @ wa + ba) + (1 - COMPOSITION_ALPHA) * (q @ wb + bb), g, both, nq),
            }

    held = heldout_subclasses(cfg)
    generalisation = {"heldout_subclasses": {}, "paraphrase": {}}
    for c in CATEGORIES:
        rows = np.flatnonzero(np.isin(y[c], held[c]))[:nq]
        ignore = rows[:, None] == np.arange(len(g))[None, :]
        held_map = {name: metrics.mean_average_precision(query @ g.T, y[c][rows], y[c], ignore=ignore)
                    for name, query in (("base", g[rows]), ("ours_heldout_model", held_model.transform(g[rows], c)),
                                        ("ours_all_subclasses_model", ours.transform(g[rows], c)))}
        generalisation["heldout_subclasses"][c] = {
            "subclasses": [VALUES[c][k] for k in held[c]], "n_queries": len(rows), **held_map}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UntrainedAttributeWarning)  # a paraphrase is untrained by design
            para = ours.transform(q, PARAPHRASES[c])
        generalisation["paraphrase"][c] = {"text": PARAPHRASES[c], "base": qmap[c]["base"], "trained_name": qmap[c]["ours"],
                                           "paraphrase": query_map(para, g, y[c], nq)}

    arrays = out / "arrays"
    atomic_save_npz(arrays / "controlembed.npz", gallery_emb=g.astype(np.float32), n_queries=np.array(nq),
                    **{f"label_{c}": y[c] for c in CATEGORIES},
                    **{f"W_{c}": affines[c][0] for c in CATEGORIES}, **{f"b_{c}": affines[c][1] for c in CATEGORIES},
                    **{f"text_{c}": emb[f"text_{c}"] for c in CATEGORIES})
    atomic_save_npz(arrays / "probe.npz", train_emb=emb["train_emb"], test_emb=emb["test_emb"],
                    **{f"train_label_{c}": y_train[c] for c in CATEGORIES})
    atomic_write_text(arrays / "README.md", ARRAYS_README)
    mean = {m: float(np.mean([qmap[c][m] for c in CATEGORIES])) for m in METHODS}
    return {
        "query_map": qmap, "query_map_mean": mean,
        "cluster_acc": cacc, "cluster_acc_mean": {m: float(np.mean([cacc[c][m] for c in CATEGORIES])) for m in ("base", "ours")},
        "zero_shot_transformed": zshot, "linear_probe": probe, "composition": composition,
        "generalisation": generalisation, "n_test": len(g), "n_queries": nq,
        "timing": {"cluster_5000_s": cluster_5000_seconds(512, n_init=cfg.kmeans_n_init, seed=cfg.seed),
                   "cluster_5000_s_at_our_d": cluster_5000_seconds(g.shape[1], n_init=cfg.kmeans_n_init, seed=cfg.seed),
                   "fit_s": {p.name: read_json(p / "fit_time.json")["seconds"] for p in sorted(fit_dir.iterdir())
                             if (p / "fit_time.json").is_file()}},
    }


ARRAYS_README = """# arrays/

`controlembed.npz` recomputes the headline numbers of results.json with `vlctl.eval.metrics`:

- `gallery_emb` (N, D): L2-normalised test-image embeddings (the frozen gallery).
- for each taxonomy t in {color, texture, count, shape}: `label_t` (N,) subclass index (into
  vlctl.data.shapes.VALUES[t]), `W_t` (D, D) and `b_t` (D,) the hypernetwork's map for the text t,
  and `text_t` (10, D) the subclass text embeddings (prompt-template averages).
- `n_queries`: the first n_queries gallery items are the queries.

With g = gallery_emb, q = g[:n_queries]:
- `query_map[t]["ours"] = mean_average_precision((q @ W_t + b_t) @ g.T, label_t[:n], label_t, ignore)`
  with ignore[i, i] = True (a query is not its own result); "base" uses q @ g.T.
- `cluster_acc[t]["ours"] = cluster_accuracy(label_t, KMeans(10, n_init, seed).fit_predict(normalize(g @ W_t + b_t)))`
  (k-means is seeded; other scikit-learn versions may differ slightly).
- `zero_shot_transformed[t]["ours"] = zero_shot_accuracy(g @ W_t + b_t, text_t, label_t)`.
- composition "a+b": labels label_a * 100 + label_b, query 0.5 (q W_a + b_a) + 0.5 (q W_b + b_b).

`probe.npz` recomputes `linear_probe[t]`: `train_emb` and `test_emb` are the frozen (unnormalised)
embeddings, `train_label_t` the training labels (test labels: `label_t` above), and
`linear_probe[t] = 100 * mean(LogisticRegression(max_iter=2000, C=10).fit(train_emb,
train_label_t).predict(test_emb) == label_t)` (scikit-learn, lbfgs).
"""


# --- figures and report --------------------------------------------------------------------------


def _figures(out: Path, r: dict, data_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    x = np.arange(len(CATEGORIES))
    fig, ax = plt.subplots(figsize=(7, 3.4))
    width = 0.8 / len(METHODS)
    for i, m in enumerate(METHODS):
        ax.bar(x + (i - (len(METHODS) - 1) / 2) * width, [r["query_map"][c][m] for c in CATEGORIES], width, label=m)
    ax.set_xticks(x, CATEGORIES)
    ax.set_ylabel("query mAP (%)")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(fig_dir / "query_map.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.2))
    for i, m in enumerate(("base", "ours")):
        ax.bar(x + (i - 0.5) * 0.4, [r["cluster_acc"][c][m] for c in CATEGORIES], 0.4, label=m)
    ax.plot(x, [10.0] * len(x), "k_", markersize=20, label="chance")
    ax.set_xticks(x, CATEGORIES)
    ax.set_ylabel("clustering accuracy (%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(fig_dir / "cluster_acc.png", dpi=120)
    plt.close(fig)

    data = load_shapes(data_dir / "test")
    fig, axes = plt.subplots(3, 8, figsize=(12, 5.4))
    for ax, i in zip(axes.flat, range(24)):
        lab = data["labels"][i]
        ax.imshow(data["images"][i], interpolation="nearest")
        ax.set_title(f"{lab['count']} {lab['color']}\n{lab['texture']} {lab['shape']}", fontsize=6)
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(fig_dir / "samples.png", dpi=110)
    plt.close(fig)


def stage_keys(cfg: ControlEmbedShapesRecipe) -> dict[str, dict]:
    """The keys of the data and train stages (a shipped checkpoint is found by its train key)."""
    from vlctl.encoders.tiny_config import get_config

    data_key = {"n_train": cfg.n_train, "n_test": cfg.n_test, "image_size": cfg.image_size, "seed": cfg.seed,
                "shapes": config_to_dict(ShapesConfig())}
    clip_fields = ("model", "epochs", "batch_size", "lr", "temperature_lr", "warmup_steps", "weight_decay", "procs")
    # The architecture itself, not only its name: editing a config JSON must retrain.
    train_key = {"data": data_key, **{f: getattr(cfg, f) for f in clip_fields},
                 "architecture": config_to_dict(get_config(cfg.model))}
    return {"data": data_key, "train": train_key}


def shipped_stage_keys(cfg: ControlEmbedShapesRecipe, stages: Path | None = None, **_: object) -> dict[str, dict]:
    """The stage `make demo` ships: the CLIP's training (its key depends on the config only)."""
    return {"train": stage_keys(cfg)["train"]}


def run(out: Path, quick: bool = False, force: bool = False, cfg: ControlEmbedShapesRecipe | None = None,
        stages: str | Path | None = None, from_scratch: bool = False) -> Path:
    cfg = cfg or load_preset(quick)
    runner = Runner(out, force=force, stages=stages, from_scratch=from_scratch)
    t_start = time.perf_counter()
    keys = stage_keys(cfg)
    data_key, train_key = keys["data"], keys["train"]

    def make_data(work: Path) -> None:
        generate_shapes(ShapesConfig(n=cfg.n_train, seed=cfg.seed, split="train", image_size=cfg.image_size), work / "train")
        generate_shapes(ShapesConfig(n=cfg.n_test, seed=cfg.seed, split="test", image_size=cfg.image_size), work / "test")

    data_dir = runner.stage("data", data_key, make_data)
    train_dir = runner.stage("train", train_key, lambda w, r: _train(cfg, data_dir / "train", w, r), resumable=True)
    embed_key = {**train_key, "templates": list(cfg.templates)}
    emb_dir = runner.stage("embed", embed_key, lambda w: _embed(cfg, train_dir / "model", data_dir, w))
    fit_fields = ("parameterisation", "rank", "hidden", "hyper_steps", "hyper_lr", "images_per_subclass",
                  "temperature", "align_weight", "heldout_per_category")
    fit_key = {**embed_key, **{f: getattr(cfg, f) for f in fit_fields}}
    fit_dir = runner.stage("fit", fit_key, lambda w: _fit(cfg, emb_dir, data_dir, w))

    results = {"recipe": "controlembed-shapes", "quick": quick, "config": config_to_dict(cfg),
               "encoder_id": read_json(emb_dir / "encoder.json")["encoder_id"], "paper": PAPER,
               **evaluate(cfg, emb_dir, fit_dir, data_dir, out)}
    results["timings"] = {**runner.timings, "total_seconds": time.perf_counter() - t_start}
    _figures(out, results, data_dir)
    atomic_write_json(out / "results.json", results)
    _report(cfg, results, quick).write(out)
    return out / "report.md"


def _report(cfg: ControlEmbedShapesRecipe, r: dict, quick: bool) -> Report:
    rep = Report(f"controlembed-shapes{' (--quick)' if quick else ''}: text-conditioned affine maps on Clevr-4-like shapes")
    rep.text(f"Encoder `{r['encoder_id']}` ({cfg.model}, TinyCLIP trained from scratch on {cfg.n_train} captioned shapes "
             f"images for {cfg.epochs} epochs). Gallery: {r['n_test']} test images; queries: the first {r['n_queries']}. "
             f"Hypernetwork: {cfg.parameterisation} W, {cfg.hyper_steps} episodes, tau {cfg.temperature}, omega "
             f"{cfg.align_weight}. Paper: ControlEmbed with CLIP ViT-L/14 on the real Clevr-4. All numbers are "
             "percentages; arrays/README.md says how to recompute them.")
    rep.heading("What the encoder holds")
    rep.text("Linear probe (logistic regression on frozen train embeddings, test accuracy): whether the attribute is "
             "in the embedding at all. A transform cannot recover what the embedding does not hold.")
    rep.table(["taxonomy", "linear probe", "base query mAP"], [[c, r["linear_probe"][c], r["query_map"][c]["base"]]
                                                               for c in CATEGORIES])
    rep.heading("Attribute-aware retrieval (query mAP)")
    rep.text("Only the query is transformed; the gallery is the frozen test embeddings. translation_only: W = I (the "
             "paper's ablation); text_projection: training-free projection onto the span of the category's subclass "
             "text embeddings (the CWP/LCR family); per_attribute: one affine adapter per attribute with the same loss.")
    rows = [[c, *[r["query_map"][c][m] for m in METHODS]] for c in CATEGORIES]
    rows.append(["mean", *[r["query_map_mean"][m] for m in METHODS]])
    rows.append(["paper (Clevr-4)", PAPER["query_map_base"], PAPER["query_map_translation_only"], PAPER["query_map_cwp"],
                 None, PAPER["query_map_ours"]])
    rep.table(["taxonomy", *METHODS], rows)
    rep.figure("figures/query_map.png", "Query mAP per taxonomy and method")
    rep.heading("Multi-clustering (k-means, Hungarian-matched accuracy, k = 10)")
    rows = [[c, r["cluster_acc"][c]["base"], r["cluster_acc"][c]["ours"]] for c in CATEGORIES]
    rows.append(["mean", r["cluster_acc_mean"]["base"], r["cluster_acc_mean"]["ours"]])
    rows.append(["paper (Clevr-4)", PAPER["cluster_acc_base"], PAPER["cluster_acc_ours"]])
    rep.table(["taxonomy", "base", "ours"], rows)
    rep.figure("figures/cluster_acc.png", "Clustering accuracy per taxonomy")
    t = r["timing"]
    rep.text(f"Transform + k-means + Hungarian for 5,000 images: {t['cluster_5000_s']:.3f} s at D = 512, "
             f"{t['cluster_5000_s_at_our_d']:.3f} s at our D (paper: {PAPER['cluster_5000_s']} s).")
    rep.heading("Text-based zero-shot classification")
    rep.text("Cosine of the (transformed) embedding with the subclass prompt-ensemble text embeddings. Paper (Clevr-4, "
             f"text-based classification): {PAPER['text_classification_ours']} with the alignment loss, "
             f"{PAPER['text_classification_without_alignment']} without.")
    rep.table(["taxonomy", "base", "ours"], [[c, r["zero_shot_transformed"][c]["base"], r["zero_shot_transformed"][c]["ours"]]
                                             for c in CATEGORIES])
    rep.heading(f"Composition (alpha = {COMPOSITION_ALPHA})")
    rep.text("Positives share both attributes. Single transforms and the training-free blend of the two.")
    rep.table(["pair", "base", "first only", "second only", "blend"],
              [[p, v["base"], v[p.split("+")[0]], v[p.split("+")[1]], v["blend"]] for p, v in r["composition"].items()])
    rep.heading("Generalisation")
    rep.text(f"Held-out subclasses: a hypernetwork trained without {cfg.heldout_per_category} subclasses per category "
             "(training images with any held-out value removed), queried with images of the held-out subclasses.")
    rep.table(["taxonomy", "held out", "base", "held-out model", "model trained on all"],
              [[c, ", ".join(v["subclasses"]), v["base"], v["ours_heldout_model"], v["ours_all_subclasses_model"]]
               for c, v in r["generalisation"]["heldout_subclasses"].items()])
    rep.text("Paraphrased category names, embedded by the same MiniLM text encoder as the hypernetwork's input.")
    rep.table(["taxonomy", "paraphrase", "base", "trained name", "paraphrase mAP"],
              [[c, v["text"], v["base"], v["trained_name"], v["paraphrase"]] for c, v in r["generalisation"]["paraphrase"].items()])
    rep.figure("figures/samples.png", "Test images with their attributes")
    rep.timings(r["timings"])
    return rep
