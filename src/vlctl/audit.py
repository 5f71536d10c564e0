"""`vlctl audit`: 3VL's compositional analysis of any encoder on a user's own image-caption pairs.

For every caption the 3VL caption tree is built (`vlctl.captions.trees.TreeGenerator`); every
level's positive P and each of its one-word negatives N make one item, scored with the encoder
against the caption's image: correct when cos(image, P) > cos(image, N). Accuracy is reported by
the POS of the replaced word, by level depth (1 = the coarsest level), by replacement source
(table / antonym / co_hyponym / ...) and for the most frequent replaced words, each with a
bootstrap 95% interval: captions are resampled with replacement (the items of one caption are
not independent), `n_boot` times, and the interval is the 2.5 / 97.5 percentiles of the
resampled accuracies. The worst items (largest cos(image, N) - cos(image, P)) are shown with
their image, caption, negative, both scores and the Anchor / DiRe maps (`write_explain`).

Pairs (`load_pairs`): a CSV / TSV / JSONL table of image path + caption, a folder with
annotations, WebDataset shards or a generated set (`vlctl.data.source.open_source`), the COCO
Karpathy JSON (`load_karpathy`, images under `images` or the JSON's folder), or a store made by
`vlctl embed` (its recorded source is read again: the encoder under audit embeds the pixels
itself). Images that are not on disk are counted, the place looked in is named, and the rest
is audited.

Scenes (a generated `vlctl data scenes` set) get the generator of the 3vl-scenes recipe (the
scenes' opposites and vocabulary, with the scenes' words forced to their part of speech:
`scene_pos`) and one more breakdown, by checklist category of the replaced word; another source with an encoder whose text tower has a closed
word vocabulary (TinyCLIP) restricts replacements to that vocabulary, so that no negative is
made of unknown tokens.

`repair` (TinyCLIP encoders): the images are split (seeded) into a repair part and a held-out
part (`holdout`); the encoder is fine-tuned with the tree loss (LoRA, `TreeTuner`) on the repair
part, then the held-out part is audited again and image-text retrieval R@1 (both directions) is
measured before and after on it. When either R@1 drops by more than `max_drop` points, the
adapter is refused (not saved); otherwise it is saved under OUT/repair.

Everything the report shows is recomputable from OUT/items.jsonl and OUT/arrays.npz.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlctl.config import opt, validate_config
from vlctl.fsops import VlctlError


@dataclasses.dataclass(frozen=True)
class AuditConfig:
    seed: int = opt(0, "seed of the trees' choices, the pair sample, the bootstrap and the repair split",
                    ge=0, le=2**32 - 1)
    max_pairs: int = opt(0, "audit at most this many image-caption pairs, a seeded sample (0: all)", ge=0, le=10**9)
    n_boot: int = opt(1000, "bootstrap resamples of the captions for the 95 percent intervals", ge=10, le=100_000)
    n_worst: int = opt(8, "worst items shown with image, scores and Anchor / DiRe maps", ge=0, le=200)
    top_words: int = opt(15, "most frequent replaced words reported", ge=1, le=1000)
    batch_size: int = opt(256, "texts / images embedded per batch", ge=1, le=65536)
    repair: bool = opt(False, "fine-tune the encoder (TinyCLIP) with the tree loss on a split and re-audit the rest")
    max_drop: float = opt(1.0, "with repair: refuse the adapter if held-out R@1 (either direction) drops by more "
                          "than this many points", ge=0, le=100)
    holdout: float = opt(0.5, "with repair: share of the images held out for the re-audit and retrieval", gt=0, lt=1)
    repair_epochs: int = opt(5, "with repair: fine-tuning epochs", ge=1, le=10_000)
    repair_lr: float = opt(3e-3, "with repair: peak learning rate of the adapters", gt=0, le=10)
    repair_batch_size: int = opt(64, "with repair: fine-tuning batch size", ge=1, le=4096)

    def __post_init__(self) -> None:
        validate_config(self)


# --- pairs ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Pairs:
    """Image-caption pairs to audit.

    images: (n_images,) image file paths, or None with `array` (a generated set's (n, H, W, 3)).
    captions / image_of_caption: (n_captions,) each caption and the index of its image.
    missing: image paths not found (not audited); looked_in: where they were looked for.
    scenes: True for a generated scenes set (the 3vl-scenes generator is used).
    skipped: [path, reason] of a folder's files that look like images but are not read
    (`vlctl.data.source.ImageSource.skipped`), listed with the unreadable images.
    """

    name: str
    images: list | None
    array: Any
    captions: list[str]
    image_of_caption: np.ndarray
    missing: list[str]
    looked_in: str
    scenes: bool = False
    skipped: list = dataclasses.field(default_factory=list)

    @property
    def n_images(self) -> int:
        return len(self.images) if self.images is not None else int(self.array.shape[0])

    def image(self, i: int) -> np.ndarray:
        """Image i as uint8 (H, W, 3)."""
        if self.array is not None:
            return np.asarray(self.array[i])
        from vlctl.methods.threevl.explain import load_image

        return load_image(self.images[i])


def load_pairs(path: str | Path, images: str | Path | None = None, annotations: str | Path | None = None) -> Pairs:
    """The pairs of `path` (module docstring for the forms). `images`: the folder the image paths of
    a COCO Karpathy JSON or of a CSV / TSV / JSONL table are relative to (default: the file's own
    folder); `annotations`: the caption table of a folder of images."""
    path = Path(path)
    if not path.exists():
        raise VlctlError(f"{path}: pairs not found (a CSV/TSV/JSONL of image and caption, a folder, a COCO "
                         "Karpathy JSON, a generated set or a store)")
    if path.is_dir() and (path / "manifest.json").is_file():
        return _store_pairs(path, images, annotations)
    if path.is_file() and path.suffix.lower() == ".json":
        from vlctl.data.loaders.retrieval import load_karpathy

        root = Path(images) if images is not None else path.parent
        data = load_karpathy(path, root=root, on_missing="skip")
        return Pairs(str(path), [str(p) for p in data.image_paths()], None, list(data.captions),
                     np.asarray(data.image_of_text, dtype=np.int64), list(data.missing), str(root.resolve()))
    from vlctl.data.source import TABLE_SUFFIXES, open_source

    if images is not None and not (path.is_file() and path.suffix.lower() in TABLE_SUFFIXES):
        raise VlctlError(f"--images {images}: goes with a COCO Karpathy JSON or a caption table as --pairs "
                         f"(a folder's images are the folder's own)")
    if path.is_file() and path.suffix.lower() in TABLE_SUFFIXES and images is not None:
        from vlctl.data.loaders.folder import load_caption_table

        data = load_caption_table(path, root=images, on_missing="skip")
        root = Path(images)
        files = [str(p.resolve()) for p in data.image_paths()]
        return _pairs_of(str(path), files, None, data.captions_by_image(), list(data.missing), root.resolve())
    src = open_source(path, annotations, on_missing="skip")
    looked = path.resolve().parent if path.is_file() else path.resolve()
    pairs = _pairs_of(str(path), list(src.files) if src.files is not None else None, src.array, src.captions,
                      list(src.missing), looked, scenes=src.kind == "generated" and
                      str(src.data_id or "").startswith("scenes-"))
    pairs.skipped = [list(f) for f in src.skipped]
    return pairs


def _pairs_of(name: str, files: list | None, array: Any, captions: Sequence[Sequence[str]], missing: list[str],
              looked: Path, scenes: bool = False) -> Pairs:
    """Pairs from each image's captions; a source with none is an error that says where the
    images were looked for when that is why."""
    caps, owner = [], []
    for i, cs in enumerate(captions):
        caps += list(cs)
        owner += [i] * len(cs)
    if not caps:
        if missing:
            raise VlctlError(f"{name}: none of the {len(missing)} images it names is under {looked} (first: "
                             f"{missing[0]!r}); name the folder they are relative to with --images DIR")
        raise VlctlError(f"{name}: no captions; audit scores each caption against its image")
    return Pairs(name, files, array, caps, np.asarray(owner, dtype=np.int64), missing, str(looked), scenes=scenes)


def _store_pairs(path: Path, images: str | Path | None, annotations: str | Path | None) -> Pairs:
    """The pairs of a store from `vlctl embed`: the images and captions its rows record (the
    encoder under audit embeds the pixels itself); a generated set's store reads its set again."""
    from vlctl.embeddings.store import open_store

    if annotations is not None or images is not None:
        raise VlctlError(f"{path}: a store records its own images and captions; drop --annotations / --images")
    store = open_store(path)
    source = store.info.get("source")
    if source and store.info.get("data_id"):  # a generated set: its pixels are in the set, not in files
        return load_pairs(source)
    meta = store.metadata()
    if not any(m.get("captions") for m in meta):
        raise VlctlError(f"{path}: the store holds no captions (embed with --annotations naming a caption column, "
                         "or a caption table); audit scores each caption against its image")
    files = [m.get("path") for m in meta]
    missing = [f for f in files if not Path(str(f)).is_file()]
    keep = [i for i, f in enumerate(files) if f not in missing and meta[i].get("captions")]
    return _pairs_of(str(path), [files[i] for i in keep], None, [meta[i]["captions"] for i in keep], missing,
                     path.resolve())


def drop_unreadable(pairs: Pairs, strict: bool = False) -> tuple[Pairs, list[list[str]]]:
    """The pairs less the images that cannot be read, and [path, reason] of each of those (the
    skip-and-list policy, `vlctl.cli.listing`): every image is decoded once by the one reader
    before any work, so a broken file neither stops the audit late nor counts as a wrong answer.
    With `strict`, the first unreadable image is an error instead."""
    from vlctl.images import ImageDecodeError, read_image

    if pairs.images is None:  # a generated set's array: nothing to decode
        return pairs, []
    if strict and pairs.skipped:
        raise VlctlError(f"{pairs.skipped[0][1]} (--strict stops at an unreadable image)")
    failures, bad = [list(f) for f in pairs.skipped], set()
    for i, path in enumerate(pairs.images):
        try:
            read_image(path)
        except ImageDecodeError as e:
            if strict:
                raise VlctlError(f"{e} (--strict stops at an unreadable image)") from None
            failures.append([str(path), str(e)])
            bad.add(i)
    if not bad:
        return pairs, failures
    keep = np.flatnonzero([int(i) not in bad for i in pairs.image_of_caption])
    if not len(keep):
        raise VlctlError(f"{pairs.name}: none of its {pairs.n_images} images can be read (the first: {failures[0][1]})")
    return subset(pairs, keep), failures


def subset(pairs: Pairs, caption_idx: np.ndarray) -> Pairs:
    """The pairs of the given captions, their images renumbered."""
    caption_idx = np.asarray(caption_idx, dtype=np.int64)
    imgs = np.unique(pairs.image_of_caption[caption_idx])
    new = {int(i): k for k, i in enumerate(imgs)}
    return Pairs(pairs.name, None if pairs.images is None else [pairs.images[i] for i in imgs],
                 None if pairs.array is None else _Rows(pairs.array, imgs),
                 [pairs.captions[j] for j in caption_idx],
                 np.asarray([new[int(pairs.image_of_caption[j])] for j in caption_idx], dtype=np.int64),
                 pairs.missing, pairs.looked_in, pairs.scenes)


class _Rows:
    """Rows `idx` of an array, read lazily (a memmap stays on disk)."""

    def __init__(self, array, idx):
        self.array, self.idx = array, np.asarray(idx)
        self.shape = (len(self.idx), *array.shape[1:])

    def __getitem__(self, i):
        return self.array[self.idx[i]]

    def __array__(self, dtype=None, copy=None):
        out = np.asarray(self.array[self.idx])
        return out if dtype is None else out.astype(dtype)


# --- scoring -------------------------------------------------------------------------------------


def generator_for(pairs: Pairs, encoder: Any, seed: int):
    """The tree generator for these pairs and encoder (module docstring)."""
    from vlctl.captions.trees import TreeGenerator

    if pairs.scenes:
        return TreeGenerator(seed=seed, opposites=_scene_opposites(), vocabulary=set(_scene_vocabulary()),
                             pos_overrides=scene_pos())
    vocab = getattr(getattr(encoder, "config", None), "vocab", None)
    return TreeGenerator(seed=seed, vocabulary=set(vocab) if vocab else None)


def _scene_opposites():
    from vlctl.data.scenes import SCENE_OPPOSITES

    return SCENE_OPPOSITES


def _scene_vocabulary():
    from vlctl.data.scenes import vocabulary

    return vocabulary()


def scene_pos() -> dict[str, str]:
    """The scenes' words with their part of speech (spaCy reads "striped" and "left" as verbs):
    attribute values ADJ, shapes NOUN, relations ADP."""
    from vlctl.data.scenes import CATEGORY_ATTRIBUTE, CATEGORY_POS, VALUES

    out = {w: CATEGORY_POS[c] for c, attr in CATEGORY_ATTRIBUTE.items() for w in VALUES[attr]}
    return {**out, **{w: "ADP" for w in ("left", "right", "above", "below")}}


def scene_category(word: str) -> str | None:
    """The 3vl-scenes checklist category a replaced word belongs to (attribute_color, ...,
    relation_spatial, object), None for other words."""
    from vlctl.data.scenes import CATEGORY_ATTRIBUTE, VALUES

    for c, attr in CATEGORY_ATTRIBUTE.items():
        if word in VALUES[attr]:
            return c
    return "relation_spatial" if word in ("left", "right", "above", "below") else None


def tree_items(captions: Sequence[str], generator, scenes: bool = False) -> tuple[list[dict], int]:
    """One item per (caption, level, negative): {"caption", "depth", "positive", "negative", "pos",
    "stage", "word", "replacement"}; and the number of captions refused (no tree)."""
    trees = generator.trees(list(captions), details=True, errors="skip")
    items, refused = [], 0
    for j, tree in enumerate(trees):
        if tree is None:
            refused += 1
            continue
        for depth, lv in enumerate(tree, 1):
            last = depth == len(tree)
            for neg, (word, new, pos, stage) in zip(lv["negatives"], lv["replaced"]):
                item = {"caption": j, "depth": depth, "positive": lv["positive"], "negative": neg, "pos": pos,
                        "stage": stage, "word": word.lower(), "replacement": new}
                if scenes:
                    item["category"] = scene_category(word.lower()) or "other"
                    # the checklist changes one word of the whole caption: the tree's last level
                    item["category_caption"] = item["category"] if last else "(coarser level)"
                items.append(item)
    return items, refused


def embed_images(encoder: Any, pairs: Pairs, batch_size: int) -> np.ndarray:
    out = []
    for s in range(0, pairs.n_images, batch_size):
        batch = [pairs.image(i) for i in range(s, min(pairs.n_images, s + batch_size))]
        out.append(np.asarray(encoder.embed_images(batch), dtype=np.float32))
    return np.concatenate(out) if out else np.zeros((0, encoder.embed_dim), np.float32)


def embed_texts(encoder: Any, texts: Sequence[str], batch_size: int) -> np.ndarray:
    uniq = list(dict.fromkeys(texts))
    emb = np.concatenate([np.asarray(encoder.embed_texts(uniq[s:s + batch_size]), dtype=np.float32)
                          for s in range(0, len(uniq), batch_size)]) if uniq else np.zeros((0, encoder.embed_dim))
    at = {t: k for k, t in enumerate(uniq)}
    return emb[[at[t] for t in texts]]


def score_items(items: list[dict], image_emb: np.ndarray, image_of_caption: np.ndarray, encoder: Any,
                batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(cos(image, P), cos(image, N)) per item, float32 (n_items,) each."""
    if not items:
        return np.zeros(0, np.float32), np.zeros(0, np.float32)
    pos = embed_texts(encoder, [it["positive"] for it in items], batch_size)
    neg = embed_texts(encoder, [it["negative"] for it in items], batch_size)
    img = image_emb[image_of_caption[[it["caption"] for it in items]]]
    return np.einsum("nd,nd->n", img, pos), np.einsum("nd,nd->n", img, neg)


def bootstrap_accuracy(correct: np.ndarray, caption: np.ndarray, n_captions: int, n_boot: int,
                       seed: int) -> tuple[float, float, float]:
    """(accuracy %, low, high): the share of correct items, and the 2.5 / 97.5 percentiles of it
    over `n_boot` resamples of the captions with replacement (a caption's items move together)."""
    if len(correct) == 0:
        return float("nan"), float("nan"), float("nan")
    hits = np.bincount(caption, weights=correct.astype(np.float64), minlength=n_captions)
    total = np.bincount(caption, minlength=n_captions).astype(np.float64)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n_captions, size=(n_boot, n_captions))
    h, t = hits[idx].sum(axis=1), total[idx].sum(axis=1)
    acc = 100.0 * h[t > 0] / t[t > 0]
    lo, hi = (np.percentile(acc, [2.5, 97.5]) if len(acc) else (float("nan"), float("nan")))
    return 100.0 * float(correct.mean()), float(lo), float(hi)


def breakdown(items: list[dict], correct: np.ndarray, n_captions: int, cfg: AuditConfig) -> dict[str, list]:
    """{"pos" | "depth" | "stage" | "word": [[group, n, accuracy, low, high], ...]}."""
    caption = np.asarray([it["caption"] for it in items], dtype=np.int64)
    out: dict[str, list] = {}
    keys = ("pos", "depth", "stage", "word") + (("category", "category_caption") if items and "category" in items[0]
                                                 else ())
    for key in keys:
        values = [it[key] for it in items]
        counts = collections.Counter(values)
        groups = [g for g, _ in counts.most_common(cfg.top_words)] if key == "word" else sorted(counts)
        rows = []
        for g in groups:
            m = np.asarray([v == g for v in values])
            acc, lo, hi = bootstrap_accuracy(correct[m], caption[m], n_captions, cfg.n_boot, cfg.seed)
            rows.append([g, int(m.sum()), acc, lo, hi])
        out[key] = rows
    return out


def audit_pairs(encoder: Any, pairs: Pairs, cfg: AuditConfig, generator=None) -> dict:
    """Trees, scores and the breakdowns of `pairs` under `encoder` (no files written)."""
    gen = generator if generator is not None else generator_for(pairs, encoder, cfg.seed)
    t0 = time.perf_counter()
    items, refused = tree_items(pairs.captions, gen, scenes=pairs.scenes)
    t_trees = time.perf_counter() - t0
    t0 = time.perf_counter()
    image_emb = embed_images(encoder, pairs, cfg.batch_size)
    s_pos, s_neg = score_items(items, image_emb, pairs.image_of_caption, encoder, cfg.batch_size)
    t_score = time.perf_counter() - t0
    correct = s_pos > s_neg
    caption = np.asarray([it["caption"] for it in items], dtype=np.int64)
    overall = bootstrap_accuracy(correct, caption, len(pairs.captions), cfg.n_boot, cfg.seed)
    return {"items": items, "s_pos": s_pos, "s_neg": s_neg, "correct": correct, "image_emb": image_emb,
            "refused": refused, "overall": overall, "groups": breakdown(items, correct, len(pairs.captions), cfg),
            "seconds": {"trees": t_trees, "scores": t_score}}


def retrieval_r1(encoder: Any, pairs: Pairs, image_emb: np.ndarray, batch_size: int) -> dict[str, float]:
    """Image-text retrieval R@1 (i2t, t2i) of the pairs' captions against their images, percent."""
    from vlctl.eval.metrics import recall_at_k

    text_emb = embed_texts(encoder, pairs.captions, batch_size)
    r = recall_at_k(image_emb @ text_emb.T, pairs.image_of_caption, ks=(1,))
    return {"i2t@1": r["i2t@1"], "t2i@1": r["t2i@1"]}


# --- the command -----------------------------------------------------------------------------------


def run_audit(encoder: Any, pairs: Pairs, out: str | Path, cfg: AuditConfig, blocks: Any = "all",
              failures: Sequence[Sequence[str]] = ()) -> dict:
    """Audit `pairs` with `encoder`, write OUT/report.md, report.html, items.jsonl, arrays.npz,
    summary.json and the worst items' maps under OUT/worst/; with cfg.repair also OUT/repair/.
    `failures`: [path, reason] of the images skipped as unreadable (`drop_unreadable`), reported."""
    from vlctl.io import atomic_save_npz, atomic_write_json, atomic_write_text

    out = Path(out)
    t_start = time.perf_counter()
    n_all = len(pairs.captions)
    if cfg.max_pairs and n_all > cfg.max_pairs:
        keep = np.sort(np.random.default_rng(cfg.seed).choice(n_all, cfg.max_pairs, replace=False))
        pairs = subset(pairs, keep)
    audited = pairs
    repair = None
    if cfg.repair:
        audited, repair_part = _split(pairs, cfg)
    res = audit_pairs(encoder, audited, cfg)
    items = res["items"]
    if not items:
        raise VlctlError(f"{pairs.name}: no caption gave a tree with a negative; nothing to audit")
    worst = _worst(encoder, audited, res, out / "worst", cfg, blocks)
    if cfg.repair:
        repair = _repair(encoder, audited, repair_part, res, out / "repair", cfg)
    atomic_write_text(out / "items.jsonl", "".join(json.dumps({**it, "s_pos": float(a), "s_neg": float(b)},
                                                              ensure_ascii=False) + "\n"
                                                   for it, a, b in zip(items, res["s_pos"], res["s_neg"])))
    extra = {k: np.asarray([it[k] for it in items]) for k in ("category", "category_caption") if k in items[0]}
    atomic_save_npz(out / "arrays.npz", **extra, s_pos=res["s_pos"], s_neg=res["s_neg"], correct=res["correct"],
                    caption=np.asarray([it["caption"] for it in items]), depth=np.asarray([it["depth"] for it in items]),
                    pos=np.asarray([it["pos"] for it in items]), stage=np.asarray([it["stage"] for it in items]),
                    word=np.asarray([it["word"] for it in items]))
    summary = {
        "pairs": pairs.name, "encoder": getattr(encoder, "id", None), "encoder_spec": getattr(encoder, "spec", None),
        "captions": len(audited.captions), "images": audited.n_images, "captions_in_source": n_all,
        "missing_images": len(pairs.missing), "looked_in": pairs.looked_in, "missing_examples": pairs.missing[:10],
        "failed": len(failures), "failures": [list(f) for f in failures],
        "refused_captions": res["refused"], "items": len(items),
        "accuracy": res["overall"][0], "accuracy_ci95": list(res["overall"][1:]),
        "groups": res["groups"], "worst": worst, "repair": repair,
        "seconds": {**{k: round(v, 2) for k, v in res["seconds"].items()},
                    "total": round(time.perf_counter() - t_start, 2)},
        "config": dataclasses.asdict(cfg),
    }
    atomic_write_json(out / "summary.json", summary)
    from vlctl.report.audit import audit_report

    audit_report(summary).write(out)
    return {"out": str(out), "items": len(items), "accuracy": round(res["overall"][0], 2),
            "missing_images": len(pairs.missing), "failed": len(failures), "failures": summary["failures"],
            "seconds": summary["seconds"]["total"],
            **({"repair": repair["verdict"]} if repair else {})}


def _split(pairs: Pairs, cfg: AuditConfig) -> tuple[Pairs, Pairs]:
    """(held-out pairs, repair pairs), split by image (seeded): a caption and its image stay together."""
    n = pairs.n_images
    perm = np.random.default_rng([cfg.seed, 21]).permutation(n)
    n_hold = max(1, round(cfg.holdout * n))
    if n - n_hold < 1:
        raise VlctlError(f"{pairs.name}: {n} images are too few to split for --repair")
    hold = np.zeros(n, bool)
    hold[perm[:n_hold]] = True
    held = np.flatnonzero(hold[pairs.image_of_caption])
    rest = np.flatnonzero(~hold[pairs.image_of_caption])
    return subset(pairs, held), subset(pairs, rest)


def _worst(encoder: Any, pairs: Pairs, res: dict, out: Path, cfg: AuditConfig, blocks: Any) -> list[dict]:
    """The n_worst items by cos(image, N) - cos(image, P), with their Anchor / DiRe maps when the
    encoder gives attentions (write_explain)."""
    from vlctl.io import atomic_write_bytes

    margin = res["s_neg"] - res["s_pos"]
    order = np.argsort(-margin, kind="stable")[: cfg.n_worst]
    rows = []
    for rank, k in enumerate(order.tolist()):
        it = res["items"][k]
        img_i = int(pairs.image_of_caption[it["caption"]])
        image = pairs.image(img_i)
        d = out / f"{rank:02d}"
        row = {"rank": rank, "item": int(k), "caption": pairs.captions[it["caption"]], "positive": it["positive"],
               "negative": it["negative"], "pos": it["pos"], "s_pos": float(res["s_pos"][k]),
               "s_neg": float(res["s_neg"][k]),
               "image": pairs.images[img_i] if pairs.images is not None else f"{pairs.name}[{img_i}]"}
        try:
            from vlctl.report.overlays import write_explain

            got = write_explain(encoder, image, it["positive"], it["negative"], d, blocks=blocks)
            row["anchor_text"] = got.get("anchor_text")
            row["maps"] = {Path(f).stem: str(Path(f).relative_to(out.parent)) for f in got["files"]
                           if f.endswith(".png")}
        except (VlctlError, AttributeError, NotImplementedError, TypeError) as e:
            # an encoder without attentions: the image alone
            import io

            from PIL import Image

            buf = io.BytesIO()
            Image.fromarray(np.asarray(image, dtype=np.uint8)).save(buf, format="PNG")
            atomic_write_bytes(d / "image.png", buf.getvalue())
            row["maps"] = {"image": str((d / "image.png").relative_to(out.parent))}
            row["maps_error"] = str(e).splitlines()[0][:200]
        rows.append(row)
    return rows


def _repair(encoder: Any, held: Pairs, part: Pairs, before: dict, out: Path, cfg: AuditConfig) -> dict:
    import torch

    from vlctl.encoders.tiny_encoder import TinyCLIPEncoder
    from vlctl.methods.threevl.tree_tune import TreeTuner

    model = getattr(encoder, "model", None)
    if not isinstance(encoder, TinyCLIPEncoder):
        raise VlctlError("--repair fine-tunes a TinyCLIP encoder (tiny:<dir>); this encoder is "
                         f"{getattr(encoder, 'id', type(encoder).__name__)}")
    size = model.config.image_size
    images = np.stack([_resize(part.image(i), size) for i in range(part.n_images)])
    gen = generator_for(part, encoder, cfg.seed)
    by = dict(zip(part.captions, gen.trees(part.captions, errors="skip")))
    keep = [j for j, c in enumerate(part.captions) if by.get(c)]
    if not keep:
        raise VlctlError(f"{part.name}: no caption of the repair split gave a tree")
    caps = [part.captions[j] for j in keep]
    img_rows = images[part.image_of_caption[keep]]
    trees = [by[c] for c in caps]
    tuned = _copy_model(model)  # the encoder under audit stays as it is
    t0 = time.perf_counter()
    tuner = TreeTuner(mode="tree", epochs=cfg.repair_epochs, lr=cfg.repair_lr, batch_size=cfg.repair_batch_size,
                      seed=cfg.seed, warmup_steps=0)
    with torch.random.fork_rng(devices=[]):
        tuner.fit(img_rows, caps, model=tuned, trees=trees, out_dir=out / "run")
    fit_s = time.perf_counter() - t0
    after_enc = TinyCLIPEncoder(tuner.model_)
    after = audit_pairs(after_enc, held, cfg, generator=generator_for(held, encoder, cfg.seed))
    r_before = retrieval_r1(encoder, held, before["image_emb"], cfg.batch_size)
    r_after = retrieval_r1(after_enc, held, after["image_emb"], cfg.batch_size)
    drops = {k: r_before[k] - r_after[k] for k in r_before}
    refused = max(drops.values()) > cfg.max_drop
    if not refused:
        tuner.save(out)
    return {"verdict": "refused" if refused else "kept", "max_drop": cfg.max_drop,
            "repair_captions": len(caps), "repair_images": part.n_images, "held_out_captions": len(held.captions),
            "fit_seconds": round(fit_s, 2), "steps": tuner.result_.steps,
            "accuracy_before": before["overall"], "accuracy_after": after["overall"],
            "groups_after": after["groups"], "r1_before": r_before, "r1_after": r_after,
            "r1_drop": drops, "adapters": None if refused else str(out / "adapters")}


def _copy_model(model):
    import copy

    return copy.deepcopy(model)


def _resize(image: np.ndarray, size: int) -> np.ndarray:
    image = np.asarray(image, dtype=np.uint8)
    if image.shape[:2] == (size, size):
        return image
    from PIL import Image

    return np.asarray(Image.fromarray(image).convert("RGB").resize((size, size), Image.BICUBIC), dtype=np.uint8)
