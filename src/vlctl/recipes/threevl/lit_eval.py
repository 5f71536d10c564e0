"""3vl-lit's evaluation (stage evaluate_s<seed>): the checklist items of the test split, the two
categories 3vl-lit adds to VL-CheckList's five (`extra_items`), and each model's scores on them.
The recipe and its stages: vlctl.recipes.threevl.lit; the statistics and the report: lit_report.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from vlctl.data.scenes import (
    ATTRIBUTES,
    CHECKLIST_CATEGORIES,
    VALUES,
    caption_holds,
    checklist_items,
    load_checklist,
    load_scenes,
    noun_phrase,
    render_caption,
)
from vlctl.eval.checklist import checklist_scores, row_cosine
from vlctl.fsops import VlctlError
from vlctl.io import atomic_save_npz, atomic_write_json
from vlctl.recipes.threevl.lit_report import BASE_MODELS, CATEGORIES, EXTRA_CATEGORIES

_SHARED_SENTENCE_CACHE: dict = {}  # frozen MiniLM sentence embeddings, shared by the seeds' bases


def extra_items(labels: list[dict], category: str, seed: int = 0) -> list[dict]:
    """Items of `attribute_swap` / `single_object` (vlctl.recipes.threevl.lit's docstring), in the format of
    `load_checklist` ("index", "pos", "neg", "pos_tag"); negatives false for the scene."""
    if category not in EXTRA_CATEGORIES:
        raise VlctlError(f"extra_items: unknown category {category!r} (expected one of {list(EXTRA_CATEGORIES)})")
    items = []
    for idx, lab in enumerate(labels):
        rng = np.random.default_rng([seed, 0x5A, CATEGORIES.index(category), idx])
        st, objects = lab["structure"], lab["objects"]
        if category == "attribute_swap":
            for attr in [ATTRIBUTES[i] for i in rng.permutation(3)]:  # size, color, texture
                a, b = st["nps"][0][attr], st["nps"][1][attr]
                if a == b:
                    continue
                nps = [dict(p) for p in st["nps"]]
                nps[0][attr], nps[1][attr] = b, a
                neg = {**st, "nps": nps}
                if not caption_holds(neg, objects):
                    items.append({"index": idx, "pos": render_caption(st), "neg": render_caption(neg),
                                  "from": f"{a}/{b}", "to": f"{b}/{a}", "pos_tag": "ADJ"})
                    break
        elif category == "single_object":
            k = int(rng.integers(len(st["nps"])))
            np_ = st["nps"][k]
            for attr in [ATTRIBUTES[i] for i in rng.permutation(len(ATTRIBUTES))]:
                absent = [v for v in VALUES[attr] if all(o[attr] != v for o in objects)]
                if not absent:
                    continue
                new = str(absent[int(rng.integers(len(absent)))])
                items.append({"index": idx, "pos": noun_phrase(np_), "neg": noun_phrase({**np_, attr: new}),
                              "from": np_[attr], "to": new, "pos_tag": "NOUN" if attr == "shape" else "ADJ"})
                break
    return items


# Fine-tuning scenes whose caption is tested against its relation reversed with every model (the
# relation_spatial checklist items of those scenes): whether a loss fits the relations of the scenes
# it trained on (learnable in the budget) or not even those.
TRAIN_RELATION_ITEMS = 300


def test_items(data_dir: Path, seed: int) -> dict[str, list[dict]]:
    labels = load_scenes(data_dir / "test")["labels"]
    items = {c: load_checklist(data_dir / "test", c) for c in CHECKLIST_CATEGORIES}
    items.update({c: extra_items(labels, c, seed) for c in EXTRA_CATEGORIES})
    return items


def load_tuned(stage_dir: Path):
    """The fine-tuned LiT TinyCLIP of a finetune stage (merged ViT adapters + MiniLM adapters); of a
    base stage (no adapters), its base."""
    from vlctl.encoders import tiny_pretrained
    from vlctl.methods.threevl.lora import MINILM_LORA_INFO, load_minilm_lora

    model = tiny_pretrained.load_pretrained(stage_dir / "model")
    if (stage_dir / "adapters" / MINILM_LORA_INFO).is_file():
        load_minilm_lora(model, stage_dir / "adapters")
    return model.eval()


def evaluate(cfg, seed: int, data_dir: Path, ft_data_dir: Path, base_dirs: dict, ft_dirs: dict,
              work: Path) -> None:
    """Stage evaluate_s<seed>: the checklist scores of seed `seed`'s four models, Anchor removal on its tree
    model, and MiniLM's own cosines (the frozen tower: the same for every seed)."""
    import torch

    from vlctl.captions.anchor import anchor_text
    from vlctl.encoders import tiny_pretrained
    from vlctl.encoders.tiny_encoder import TinyCLIPEncoder
    from vlctl.methods.threevl import relevancy as rel

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    timings: dict[str, float] = {}
    test = load_scenes(data_dir / "test")
    items = test_items(data_dir, cfg.data_seed)
    arrays: dict[str, np.ndarray] = {}
    x_all = None
    ft = load_scenes(ft_data_dir / "finetune")
    rel_items = checklist_items(ft["labels"][:TRAIN_RELATION_ITEMS], "relation_spatial")
    t0 = time.perf_counter()
    for name in BASE_MODELS:
        if name == "base":
            model = tiny_pretrained.load_pretrained(base_dirs[seed] / "model")
            model.text.share_cache(_SHARED_SENTENCE_CACHE)
        else:
            model = load_tuned(ft_dirs[(name, seed)])
        enc = TinyCLIPEncoder(model)
        if x_all is None:
            x_all = enc.preprocess_batch(np.asarray(test["images"]))
        with torch.no_grad():
            for c, scores in checklist_scores(enc, x_all, items).items():
                arrays[f"scores_{name}_s{seed}__{c}"] = scores
            x_ft = enc.preprocess_batch(np.asarray(ft["images"][:TRAIN_RELATION_ITEMS]))
            arrays[f"train_relation_{name}_s{seed}"] = checklist_scores(enc, x_ft, {"r": rel_items})["r"]
        if name == "tree":  # Anchor token removal on the first n_relevancy items of each category
            for c in CHECKLIST_CATEGORIES:
                its = items[c][: cfg.n_relevancy]
                x = x_all[[it["index"] for it in its]]
                maps = rel.anchor_map(enc, x, [anchor_text(it["pos"], it["neg"]) for it in its])
                with torch.no_grad():
                    e = rel.remove_tokens(enc, x, maps, cfg.removal_fraction).float()
                    p = enc.encode_texts(enc.tokenize([it["pos"] for it in its]))
                    n = enc.encode_texts(enc.tokenize([it["neg"] for it in its]))
                arrays[f"anchor_tr_s{seed}__{c}"] = np.stack([row_cosine(e, p), row_cosine(e, n)], axis=1)
    timings["checklist_and_anchor_s"] = time.perf_counter() - t0

    # Text only: MiniLM's own cosine between each positive and its negative (normalised sentence embeddings).
    t0 = time.perf_counter()
    base = tiny_pretrained.load_pretrained(base_dirs[seed] / "model")
    base.text.share_cache(_SHARED_SENTENCE_CACHE)
    for c, its in items.items():
        with torch.no_grad():
            p = base.text.sentence_features(base.tokenize([it["pos"] for it in its]))
            n = base.text.sentence_features(base.tokenize([it["neg"] for it in its]))
        arrays[f"minilm_cosine__{c}"] = row_cosine(p, n)
    timings["minilm_cosine_s"] = time.perf_counter() - t0
    atomic_save_npz(work / "eval.npz", **arrays)
    atomic_write_json(work / "eval.json", {"timings": timings,
                                           "pos_tags": {c: [it["pos_tag"] for it in its] for c, its in items.items()}})
