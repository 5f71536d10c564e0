"""3VL caption trees on real captions: speed, shape, validity and failure kinds; Anchor on SugarCrepe.

    OMP_NUM_THREADS=1 python experiments/trees_coco.py                 # all 25,010 COCO test captions
    python experiments/trees_coco.py --limit 2000 --out /tmp/trees.json

Trees: `TreeGenerator()` (default settings: curated table, WordNet from /usr/share/wordnet, no
masked LM, seed 0) over every caption of the COCO Karpathy test split, parsed in batches with
spaCy's nlp.pipe on one thread. "ms per caption" is the wall time of `trees(...)` (input checks,
parsing, negatives; model and WordNet loading excluded, timed separately) divided by the number
of captions. The WordNet look-ups are cached per word, so the cost per caption falls as the
vocabulary is covered.

Checks per tree: valid = the last level is the caption verbatim; every negative differs from its
positive in exactly one whitespace-separated word and equals no positive of the tree.

Failure kinds (counts and up to 5 examples each): captions refused (VlctlError), one-level trees
(no noun phrase, or a single noun phrase that is the whole caption), levels without any negative (split into levels with no new
NOUN/ADJ/ADP/VERB token, which the tree structure makes, and levels whose new tokens all found no
replacement), and tokens of a negated POS for which no stage found a replacement (per POS, with
the most frequent words).

Anchor: `anchor_text(caption, negative_caption)` for every pair of SugarCrepe replace_att,
replace_obj and swap_att. A pair holds when every word of the positive and of the negative outside
their longest common word alignment (difflib on lowercased regex words, independent of the
implementation's spaCy tokens) appears among the anchor's words.
"""

from __future__ import annotations

import argparse
import collections
import difflib
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

DATA = Path("/work/shared/data")
OUT = Path(__file__).with_name("trees_results.json")
_WORDS = re.compile(r"[a-z0-9]+")
N_EXAMPLES = 5


def _one_word_diff(a: str, b: str) -> bool:
    wa, wb = a.split(" "), b.split(" ")
    return len(wa) == len(wb) and sum(x != y for x, y in zip(wa, wb)) == 1


def _add_example(store: dict, kind: str, example) -> None:
    entry = store.setdefault(kind, {"count": 0, "examples": []})
    entry["count"] += 1
    if len(entry["examples"]) < N_EXAMPLES:
        entry["examples"].append(example)


def study_trees(captions: list[str]) -> dict:
    from vlctl.captions.trees import TreeGenerator
    from vlctl.fsops import VlctlError

    t0 = time.perf_counter()
    gen = TreeGenerator()
    gen.check("a dog on a couch")  # loads spaCy, WordNet and the English word list
    load_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    trees = gen.trees(captions, details=True, errors="skip")
    total_s = time.perf_counter() - t0

    failures: dict[str, dict] = {}
    missed_words: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    stages: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    levels_hist: collections.Counter = collections.Counter()
    n_levels, n_neg_per_level, valid, bad_negatives, multi = [], [], 0, 0, 0
    for cap, tree in zip(captions, trees):
        if tree is None:
            try:
                gen.check(cap)
                reason = "?"
            except VlctlError as e:
                reason = str(e)
            _add_example(failures, "refused_caption", {"caption": cap, "error": reason})
            continue
        n_levels.append(len(tree))
        levels_hist[len(tree)] += 1
        multi += len(tree) >= 2
        valid += tree[-1]["positive"] == cap
        if len(tree) == 1:  # no noun phrase, or one noun phrase that is the whole caption
            _add_example(failures, "one_level_tree", cap)
        positives = {lv["positive"] for lv in tree}
        for lv in tree:
            n_neg_per_level.append(len(lv["negatives"]))
            if not lv["negatives"]:
                # no new NOUN/ADJ/ADP/VERB at this level (e.g. only "together while" is new), or new
                # ones for which no stage found a replacement
                kind = "level_without_negative_all_missed" if lv["missed"] else "level_without_new_word"
                _add_example(failures, kind, {"caption": cap, "level": lv["positive"], "missed": lv["missed"]})
            for neg in lv["negatives"]:
                if neg in positives or not _one_word_diff(lv["positive"], neg):
                    bad_negatives += 1
                    _add_example(failures, "invalid_negative", {"positive": lv["positive"], "negative": neg})
            for word, new, pos, stage in lv["replaced"]:
                stages[pos][stage] += 1
            for word, pos in lv["missed"]:
                missed_words[pos][word.lower()] += 1
                _add_example(failures, f"no_replacement_{pos}", {"word": word, "level": lv["positive"]})
    n_trees = len(n_levels)
    return {
        "captions": len(captions),
        "trees": n_trees,
        "load_seconds": round(load_s, 2),
        "seconds": round(total_s, 2),
        "ms_per_caption": round(1000 * total_s / max(1, len(captions)), 3),
        "levels_per_tree_mean": round(statistics.mean(n_levels), 3) if n_levels else None,
        "levels_per_tree_histogram": {str(k): levels_hist[k] for k in sorted(levels_hist)},
        "negatives_per_level_mean": round(statistics.mean(n_neg_per_level), 3) if n_neg_per_level else None,
        "negatives_per_tree_mean": round(sum(n_neg_per_level) / max(1, n_trees), 3),
        "share_with_2plus_levels": round(multi / max(1, n_trees), 5),
        "share_valid": round(valid / max(1, len(captions)), 5),
        "invalid_negatives": bad_negatives,
        "replacement_stage_counts": {pos: dict(c.most_common()) for pos, c in sorted(stages.items())},
        "missed_replacements_by_pos": {pos: sum(c.values()) for pos, c in sorted(missed_words.items())},
        "missed_top_words": {pos: c.most_common(15) for pos, c in sorted(missed_words.items())},
        "failures": dict(sorted(failures.items())),
    }


def _diff_words(p: str, n: str) -> tuple[list[str], list[str]]:
    pw, nw = _WORDS.findall(p.lower()), _WORDS.findall(n.lower())
    dp, dn = [], []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, pw, nw, autojunk=False).get_opcodes():
        if op != "equal":
            dp += pw[i1:i2]
            dn += nw[j1:j2]
    return dp, dn


def study_anchor(files: list[Path]) -> dict:
    from vlctl.captions.anchor import anchor_text
    from vlctl.fsops import VlctlError

    out = {}
    for path in files:
        pairs = json.loads(path.read_text())
        ok, errors, missing, lengths = 0, {}, {}, []
        t0 = time.perf_counter()
        for key, item in pairs.items():
            p, n = item["caption"], item["negative_caption"]
            try:
                anchor = anchor_text(p, n)
            except VlctlError as e:
                _add_example(errors, str(e).split(";")[0].split("(")[0][:60], {"id": key, "positive": p, "negative": n})
                continue
            words = set(_WORDS.findall(anchor.lower()))
            dp, dn = _diff_words(p, n)
            lost = [w for w in dp + dn if w not in words]
            lengths.append(len(anchor.split()))
            if lost:
                _add_example(missing, "anchor_misses_differing_word",
                             {"id": key, "positive": p, "negative": n, "anchor": anchor, "missing": lost})
            else:
                ok += 1
        secs = time.perf_counter() - t0
        out[path.stem] = {
            "pairs": len(pairs),
            "anchor_holds_differing_words": ok,
            "share_ok": round(ok / max(1, len(pairs)), 5),
            "refused": sum(e["count"] for e in errors.values()),
            "refused_kinds": errors,
            "failures": missing,
            "anchor_words_mean": round(statistics.mean(lengths), 2) if lengths else None,
            "ms_per_pair": round(1000 * secs / max(1, len(pairs)), 3),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--coco", default=str(DATA / "coco_karpathy_test.json"), help="COCO Karpathy test JSON")
    ap.add_argument("--sugarcrepe", default=str(DATA / "sugarcrepe"), help="folder of SugarCrepe JSON files")
    ap.add_argument("--limit", type=int, default=0, help="use only the first N captions (0: all)")
    ap.add_argument("--out", default=str(OUT), help="results JSON (default: experiments/trees_results.json)")
    args = ap.parse_args(argv)

    import spacy
    import torch

    torch.set_num_threads(1)
    captions = [c for item in json.loads(Path(args.coco).read_text()) for c in item["caption"]]
    if args.limit:
        captions = captions[: args.limit]
    trees = study_trees(captions)
    anchor = study_anchor([Path(args.sugarcrepe) / f"{name}.json" for name in ("replace_att", "replace_obj", "swap_att")])
    import nltk

    from vlctl.captions.text import _nlp_id
    from vlctl.captions.trees import GENERATOR_VERSION
    from vlctl.io import atomic_write_json

    result = {
        "command": "OMP_NUM_THREADS=1 python experiments/trees_coco.py" + (f" --limit {args.limit}" if args.limit else ""),
        "generator": GENERATOR_VERSION,
        "spacy": f"{spacy.__version__} {_nlp_id()}",
        "nltk": nltk.__version__,
        "threads": 1,
        "coco_trees": trees,
        "sugarcrepe_anchor": anchor,
    }
    atomic_write_json(args.out, result)
    t = trees
    print(f"COCO: {t['trees']}/{t['captions']} trees, {t['ms_per_caption']} ms/caption (load {t['load_seconds']} s), "
          f"{t['levels_per_tree_mean']} levels/tree, {t['negatives_per_level_mean']} negatives/level, "
          f">=2 levels {t['share_with_2plus_levels']:.2%}, valid {t['share_valid']:.2%}, "
          f"invalid negatives {t['invalid_negatives']}")
    print("  missed replacements by POS:", t["missed_replacements_by_pos"])
    print("  failure kinds:", {k: v["count"] for k, v in t["failures"].items()})
    for name, a in anchor.items():
        print(f"Anchor {name}: {a['anchor_holds_differing_words']}/{a['pairs']} hold the differing words, "
              f"{a['refused']} refused, {a['ms_per_pair']} ms/pair")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
