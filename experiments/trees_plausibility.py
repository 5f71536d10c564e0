"""Does the bundled MiniLM sentence model tell good tree negatives from bad ones? (issue 21, the
optional plausibility filter: "measure whether it helps before keeping it").

On the judged samples of the latest generator rounds (experiments/trees_judged_<seed>.json, 100
negatives each, every one read and marked good or bad by the lead), three signals per negative,
all from all-MiniLM-L6-v2's normalised sentence embeddings:

  paraphrase   cos(positive level, negative level): high = a paraphrase, maybe still true;
               also with its dependence on the level's length (fitted on the first half) removed.
  plausible    max cos(negative level, real captions): how close the negative comes to a
               sentence people wrote. The bank is COCO Karpathy test captions 0-2,999, which no
               judged sample draws from (experiments/trees_quality.py --start 3000).
  drop         plausible(positive level) - plausible(negative level): how much less like a
               real caption the edit made it.

For each: the ROC-AUC of separating bad from good (0.5 = no information), and a filter chosen on
the first half of the samples (the threshold that drops the most bad negatives while keeping at
least `--keep` of all of them) and scored on the second half: the good-rate of what is kept
against the good-rate of everything. Nothing here is tuned on the second half.

    python experiments/trees_plausibility.py --out experiments/trees_plausibility.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
FIT_SEEDS, TEST_SEEDS = (2111, 2113), (2115, 2117)  # generator rounds 4-7, judged by the lead


def choose_threshold(score: np.ndarray, bad: np.ndarray, keep: float) -> float:
    """The threshold t (drop score > t) that drops the most bad items among those keeping at least
    a `keep` share of all items; ties broken toward keeping more."""
    best_t, best_dropped = np.inf, -1
    for t in np.unique(score):
        kept = score <= t
        if kept.mean() < keep:
            continue
        dropped_bad = int((bad & ~kept).sum())
        if dropped_bad > best_dropped:
            best_t, best_dropped = float(t), dropped_bad
    return best_t


def auc(score: np.ndarray, bad: np.ndarray) -> float:
    """ROC-AUC of `score` as a detector of bad negatives, as a fraction (`metrics.roc_auc` / 100)."""
    from vlctl.eval.metrics import roc_auc

    return roc_auc(score, bad) / 100.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--captions", default=str(HERE.parent.parent / "shared/data/coco_karpathy_test.json"))
    ap.add_argument("--bank", type=int, default=3000, help="captions 0..bank-1 form the real-caption bank")
    ap.add_argument("--keep", type=float, default=0.9, help="a filter must keep at least this share")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch

    from vlctl.encoders.minilm import load_sentence_transformer

    items = {s: json.loads((HERE / f"trees_judged_{s}.json").read_text())["items"] for s in FIT_SEEDS + TEST_SEEDS}
    rows = [(s, it) for s in FIT_SEEDS + TEST_SEEDS for it in items[s]]
    flat = [c for entry in json.loads(Path(args.captions).read_text()) for c in entry["caption"]]
    bank_texts = [" ".join(c.split()) for c in flat[: args.bank]]
    model = load_sentence_transformer()
    def enc(texts: list[str]) -> np.ndarray:
        return model.encode(texts, batch_size=128, convert_to_numpy=True, normalize_embeddings=True)

    with torch.inference_mode():
        bank = enc(bank_texts)
        pos = enc([it["level"] for _, it in rows])
        neg = enc([it["negative"] for _, it in rows])
    bad = np.array([not it["good"] for _, it in rows])
    fit = np.array([s in FIT_SEEDS for s, _ in rows])
    # A one-word change moves a long level's embedding less: the paraphrase signal's length effect,
    # fitted on the first half only (cos ~ a + b / words), is taken out in "paraphrase_vs_length".
    cos = (pos * neg).sum(1)
    inv_words = np.array([1.0 / len(it["level"].split()) for _, it in rows])
    a, b = np.polyfit(inv_words[fit], cos[fit], 1)[::-1]
    signals = {
        "paraphrase": cos,
        "paraphrase_vs_length": cos - (a + b * inv_words),
        "implausible": -(neg @ bank.T).max(1),  # higher = further from every real caption
        "drop": (pos @ bank.T).max(1) - (neg @ bank.T).max(1),
    }
    report = {"fit_samples": FIT_SEEDS, "test_samples": TEST_SEEDS, "n_fit": int(fit.sum()), "n_test": int((~fit).sum()),
              "bad_fit": int(bad[fit].sum()), "bad_test": int(bad[~fit].sum()), "bank": args.bank, "keep": args.keep,
              "good_rate_test_all": round(100 * float((~bad[~fit]).mean()), 1), "signals": {}}
    for name, score in signals.items():
        t = choose_threshold(score[fit], bad[fit], args.keep)
        kept = score[~fit] <= t
        report["signals"][name] = {
            "auc_all": round(auc(score, bad), 3), "auc_fit": round(auc(score[fit], bad[fit]), 3),
            "auc_test": round(auc(score[~fit], bad[~fit]), 3), "threshold": round(t, 4),
            "test_kept_share": round(float(kept.mean()), 3),
            "test_good_rate_kept": round(100 * float((~bad[~fit][kept]).mean()), 1) if kept.any() else None,
            "test_bad_dropped": int((bad[~fit] & ~kept).sum()), "test_good_dropped": int((~bad[~fit] & ~kept).sum()),
            "mean_good": round(float(score[~bad].mean()), 4), "mean_bad": round(float(score[bad].mean()), 4),
        }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
