"""Quality of 3VL caption-tree negatives on real captions (issue 21): would a reader accept them?

    OMP_NUM_THREADS=1 python experiments/trees_quality.py                     # all 25,010 COCO test captions
    python experiments/trees_quality.py --limit 5000 --out /tmp/q.json --sample-out /tmp/sample.jsonl

Trees: `TreeGenerator()` with default settings over the COCO Karpathy test captions in
/work/shared/data (one thread; "ms per caption" is the wall time of `trees(...)` after spaCy,
WordNet, wordfreq and lemminflect are loaded, divided by the number of captions; "cpu ms per
caption" is the process's CPU time, the figure to read on a machine other jobs also load).

Reported:
- negatives per tree, the share of negatives by replacement source (stage) and by POS;
- Zipf frequency (wordfreq) of the replacement words: quantiles and the share below 3;
- automatic defect counts, each checked here independently of the generator's own filters:
    article         a/an before a word that needs the other ("an young", "a animal"), an article +
                    word pair the positive does not have (its own "a ipod" is not counted);
    unknown_word    a replacement word wordfreq does not know (Zipf 0);
    related         a replacement that is the original's lemma, a synonym (shares a WordNet synset
                    with it), a hypernym or a hyponym (NLTK hypernym paths, either direction);
    prep_grammar    "of" or a phrasal-verb particle replaced, or an adposition replaced by a word
                    that is not an adposition in the re-parsed negative, or one left without object;
    rare            a replacement with Zipf below 3;
    unchanged       a negative equal to a positive of its tree;
    markup          a level or negative with HTML entities or tags, tabs, newlines or
                    non-breaking spaces;
    compound_cut    a level ending inside a WordNet compound ("a fire" of "a fire hydrant");
- Anchor (`anchor_text`) on every SugarCrepe replace_att / replace_obj / swap_att pair and on a
  seeded sample of tree positive/negative pairs: refusals and texts whose two sides are equal;
- a seeded sample of 100 negatives (caption, level, negative, replaced word, replacement, POS,
  stage) written as JSON lines, for reading by a person.

A judged sample (the JSONL rows with "good": true/false and a one-phrase "reason", in
experiments/trees_judged_<seed>.json: {"seed", "criterion", "items": [...]}) is summarised with

    python experiments/trees_quality.py --judged experiments/trees_judged_2101.json

(good-rate, and good/total by POS and by stage, recomputed from the items).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

DATA = Path("/work/shared/data")
_MARKUP = re.compile(r"&[a-z]+;|&#\d+;|<[^>]+>|[\t\n\r\u00a0\u200b]")


def _related(wn, word: str, new: str, pos: str) -> bool:
    """Same lemma, shared synset, or hypernym/hyponym of any sense (either direction)."""
    from lemminflect import getAllLemmas

    p = {"NOUN": "n", "VERB": "v", "ADJ": "a"}.get(pos)
    if p is None:
        return word.lower() == new.lower()
    lem = {word.lower(), *[x for v in getAllLemmas(word.lower()).values() for x in v]}
    nlem = {new.lower(), *[x for v in getAllLemmas(new.lower()).values() for x in v]}
    if lem & nlem:
        return True
    a = {s for w in lem for s in wn.synsets(w.replace(" ", "_"), p)}
    b = {s for w in nlem for s in wn.synsets(w.replace(" ", "_"), p)}
    if a & b:
        return True
    for x, others in ((a, b), (b, a)):
        for s in x:
            for path in s.hypernym_paths():
                if others & set(path):
                    return True
    return False


def study(captions: list[str], sample_n: int, seed: int) -> tuple[dict, list[dict]]:
    import torch

    from vlctl.captions import wordnet as wnmod
    from vlctl.captions.inflection import article_for
    from vlctl.captions.negatives import zipf
    from vlctl.captions.text import get_nlp
    from vlctl.captions.trees import TreeGenerator

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    gen = TreeGenerator()
    gen.tree("an old man in a red shirt holding a white surfboard on the beach")  # loads every model
    load_s = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    trees = gen.trees(captions, details=True, errors="skip")
    total_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    wn = wnmod.load_wordnet()
    nlp = get_nlp()

    by_stage, by_pos, zipfs = collections.Counter(), collections.Counter(), []
    defects = {k: {"count": 0, "examples": []} for k in (
        "article", "unknown_word", "related", "prep_grammar", "rare", "unchanged", "markup", "compound_cut",
        )}
    missed_reasons = collections.Counter()
    replaced_top = collections.Counter()
    rows, adp_rows = [], []
    n_neg_tree, refused = [], 0

    def defect(kind: str, ex: dict) -> None:
        defects[kind]["count"] += 1
        if len(defects[kind]["examples"]) < 8:
            defects[kind]["examples"].append(ex)

    for cap, tree in zip(captions, trees):
        if tree is None:
            refused += 1
            continue
        positives = {lv["positive"] for lv in tree}
        n_neg_tree.append(sum(len(lv["negatives"]) for lv in tree))
        for lv in tree:
            if _MARKUP.search(lv["positive"]):
                defect("markup", {"caption": cap, "level": lv["positive"]})
            # a level whose last piece ends on the first word of a WordNet compound that the
            # caption continues ("a fire" where the caption says "a fire hydrant")
            full = tree[-1]["positive"]
            piece = lv["positive"].split(" and ")[-1]
            at = full.rfind(piece)
            if lv is not tree[-1] and at >= 0:
                before = re.findall(r"[A-Za-z]+", piece)
                after = re.findall(r"[A-Za-z]+", full[at + len(piece):])
                if before and after and full[at + len(piece):at + len(piece) + 1] == " " and wnmod.is_compound(
                        wn, (before[-1].lower(), wnmod.base_form(wn, after[0].lower(), "NOUN"))):
                    defect("compound_cut", {"caption": cap, "level": lv["positive"]})
            for (word, pos), why in zip(lv["missed"], lv["missed_reason"]):
                missed_reasons[why.split(" '")[0]] += 1
            for neg, (word, new, pos, stage) in zip(lv["negatives"], lv["replaced"]):
                by_stage[stage] += 1
                by_pos[pos] += 1
                replaced_top[word.lower()] += 1
                z = zipf(new)
                zipfs.append(z)
                row = {"caption": cap, "level": lv["positive"], "negative": neg, "word": word, "replacement": new,
                       "pos": pos, "stage": stage, "zipf": z}
                rows.append(row)
                if neg in positives:
                    defect("unchanged", row)
                if _MARKUP.search(neg):
                    defect("markup", row)
                if z == 0:
                    defect("unknown_word", row)
                elif z < 3:
                    defect("rare", row)
                if _related(wn, word, new, pos):
                    defect("related", row)
                # article agreement: every a/an of the negative before a word the negative put there
                # (an article + word pair the positive does not have: the positive's own "a ipod" is
                # not the generator's; a relation phrase "next to" -> "behind" shifts word positions)
                nw = neg.split(" ")
                pw = lv["positive"].split(" ")
                pairs = {(pw[k].lower(), pw[k + 1]) for k in range(len(pw) - 1)}
                for k in range(len(nw) - 1):
                    if nw[k].lower() in ("a", "an"):
                        nxt = re.sub(r"[^A-Za-z-]", "", nw[k + 1]).lower()
                        if nxt and article_for(nxt) != nw[k].lower() and (nw[k].lower(), nw[k + 1]) not in pairs:
                            defect("article", row)
                if pos == "ADP":
                    adp_rows.append(row)
    # preposition grammar: re-parse the ADP negatives (independent of the generator's parse)
    for row, doc in zip(adp_rows, nlp.pipe(r["negative"] for r in adp_rows)):
        if row["word"].lower() == "of":
            defect("prep_grammar", {**row, "why": "of replaced"})
            continue
        toks = [t for t in doc if t.lower_ == row["replacement"].lower()]
        if not toks:
            continue
        t = toks[0]
        if t.dep_ == "prt" or t.pos_ not in ("ADP", "ADV", "SCONJ"):
            defect("prep_grammar", {**row, "why": f"re-parsed as {t.pos_}/{t.dep_}"})
        elif not any(c.dep_ in ("pobj", "pcomp") for c in t.children) and t.pos_ == "ADP":
            defect("prep_grammar", {**row, "why": "no object"})
    n = len(rows)
    rng = random.Random(seed)
    sample = rng.sample(rows, min(sample_n, n))
    zs = sorted(zipfs)
    q = (lambda p: round(zs[min(len(zs) - 1, int(p * len(zs)))], 2)) if zs else (lambda p: None)

    # Anchor: tree pairs (a seeded sample) never refused, never equal sides
    from vlctl.captions.anchor import anchor_text
    from vlctl.fsops import VlctlError

    def anchor_stats(pairs):
        ref, same, ex = 0, 0, []
        for p, ng in pairs:
            try:
                a = anchor_text(p, ng)
            except VlctlError as e:
                ref += 1
                if len(ex) < 5:
                    ex.append({"positive": p, "negative": ng, "error": str(e)})
                continue
            left, _, right = a.partition(" or ")
            if left.strip().lower() == right.strip().lower():
                same += 1
                if len(ex) < 5:
                    ex.append({"positive": p, "negative": ng, "anchor": a})
        return {"pairs": len(pairs), "refused": ref, "identical_sides": same, "examples": ex}

    tree_pairs = [(r["level"], r["negative"]) for r in random.Random(seed + 1).sample(rows, min(2000, n))]
    anchor = {"tree_pairs": anchor_stats(tree_pairs)}
    for name in ("replace_att", "replace_obj", "swap_att"):
        path = DATA / "sugarcrepe" / f"{name}.json"
        if path.is_file():
            items = json.loads(path.read_text())
            anchor[f"sugarcrepe_{name}"] = anchor_stats([(v["caption"], v["negative_caption"]) for v in items.values()])

    result = {
        "captions": len(captions), "trees": len(captions) - refused, "refused": refused,
        "load_seconds": round(load_s, 2), "seconds": round(total_s, 2),
        "ms_per_caption": round(1000 * total_s / max(1, len(captions)), 3),
        # CPU time of this process: the wall time's share of a machine other jobs also load
        "cpu_ms_per_caption": round(1000 * cpu_s / max(1, len(captions)), 3),
        "negatives": n, "negatives_per_tree_mean": round(statistics.mean(n_neg_tree), 3) if n_neg_tree else None,
        "share_by_stage": {k: round(v / n, 4) for k, v in by_stage.most_common()},
        "share_by_pos": {k: round(v / n, 4) for k, v in by_pos.most_common()},
        "zipf": {"p01": q(0.01), "p05": q(0.05), "p25": q(0.25), "median": q(0.5),
                 "share_below_3": round(sum(z < 3 for z in zipfs) / max(1, n), 5)},
        "defects": {k: {"count": v["count"], "share": round(v["count"] / max(1, n), 5), "examples": v["examples"]}
                    for k, v in defects.items()},
        "missed_reasons": dict(missed_reasons.most_common()),
        "top_replaced_words": replaced_top.most_common(25),
        "anchor": anchor,
    }
    return result, sample


def summarize_judged(path: str) -> dict:
    """Good-rate of a judged sample, overall and by POS and stage, from its items."""
    data = json.loads(Path(path).read_text())
    items = data["items"]
    out = {"seed": data.get("seed"), "n": len(items), "good": sum(bool(x["good"]) for x in items)}
    out["good_rate"] = round(out["good"] / max(1, out["n"]), 3)
    for key in ("pos", "stage"):
        groups = collections.defaultdict(lambda: [0, 0])
        for x in items:
            groups[x[key]][0] += bool(x["good"])
            groups[x[key]][1] += 1
        out[f"by_{key}"] = {k: f"{g}/{n}" for k, (g, n) in sorted(groups.items())}
    out["bad"] = [f"{x['word']} -> {x['replacement']}: {x['reason']}" for x in items if not x["good"]]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--coco", default=str(DATA / "coco_karpathy_test.json"), help="COCO Karpathy test JSON")
    ap.add_argument("--start", type=int, default=0,
                    help="skip the first N captions (the ones the filters were developed on: 3000)")
    ap.add_argument("--limit", type=int, default=0, help="use only N captions (0: all)")
    ap.add_argument("--sample", type=int, default=100, help="negatives drawn for reading")
    ap.add_argument("--seed", type=int, default=21, help="seed of the reading sample")
    ap.add_argument("--out", default="runs/trees_quality/quality.json", help="results JSON")
    ap.add_argument("--sample-out", default="runs/trees_quality/sample.jsonl", help="the reading sample (JSONL)")
    ap.add_argument("--judged", help="summarise this judged sample (JSON) instead of running the trees")
    args = ap.parse_args(argv)
    if args.judged:
        print(json.dumps(summarize_judged(args.judged), indent=1, ensure_ascii=False))
        return 0

    from vlctl.io import atomic_write_json, atomic_write_text

    captions = [c for item in json.loads(Path(args.coco).read_text()) for c in item["caption"]]
    captions = captions[args.start:]
    if args.limit:
        captions = captions[: args.limit]
    result, sample = study(captions, args.sample, args.seed)
    result["command"] = "OMP_NUM_THREADS=1 python experiments/trees_quality.py" + \
        (f" --start {args.start}" if args.start else "") + (f" --limit {args.limit}" if args.limit else "")
    atomic_write_json(args.out, result)
    atomic_write_text(args.sample_out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in sample))
    r = result
    print(f"{r['trees']}/{r['captions']} trees, {r['negatives']} negatives, {r['negatives_per_tree_mean']} per tree, "
          f"{r['ms_per_caption']} ms/caption ({r['cpu_ms_per_caption']} CPU ms; load {r['load_seconds']} s)")
    print("  by stage:", r["share_by_stage"])
    print("  by POS:", r["share_by_pos"])
    print("  Zipf:", r["zipf"])
    print("  defects:", {k: f"{v['count']} ({v['share']:.2%})" for k, v in r["defects"].items()})
    print("  anchor:", {k: (v["refused"], v["identical_sides"], v["pairs"]) for k, v in r["anchor"].items()})
    print(f"wrote {args.out} and {args.sample_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
