"""Issue 46, Deliver 4 on the shapes set: are the names `vlctl inspect sae` gives an SAE's latents
right, where the truth (each image's colour, texture, count and shape) is known?

The controlembed-shapes recipe's TinyCLIP (the quick preset's shipped `train` stage, 64 px, MiniLM
text tower) embeds a shapes set: its own 10,000 training images (seed 0, what the SAEs learn from)
and the recipe's 5,000 test images (what is inspected). Three SAEs, all by `vlctl fit sae`:

- learned: random start, 256 latents (expansion 4 of d = 64), K = 8;
- concepts: 40 latents started at the 40 attribute values' caption words (`--concepts-init`:
  TEVI's learned-SAE start, every weight trained), K = 8;
- cg: the same 40 rows fixed (a CG-SAE), K = 8.

Each is inspected on the test store (`vlctl inspect sae`: the vocabulary is the test captions'
phrases). For each live latent: the attribute values it fires for (label-AUC >= 0.8, ROC AUC of its
activation for "the image has value v", `eval.editing.concept_auc_matrix`) and the values its top
name names (a phrase of the caption scheme: "red", "wavy", "three", "cubes", "three red"...). The
top name is right when it names at least one value and every value it names is one the latent
fires for; it names a value fired for when one of its values is. Reported: both shares of the live
latents (and of those that fire for some value), beside the control (each live latent named by
another live latent's decoder row, `describe.shuffled_rows`, seed 0), and whether the command's own
check (the top name's caption-AUC >= 0.8) agrees with them. A name of no
value ("object", "objects") is never right: a caption says "object" when it does not name the shape.

    python experiments/inspect_sae_shapes.py WORK [--out experiments/inspect_sae_shapes.json]

WORK keeps the sets, stores, SAEs and inspect outputs; a step whose output is there is not redone.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from pathlib import Path

import numpy as np

from vlctl.cli import main as vlctl_main
from vlctl.data.shapes import CATEGORIES, COUNT_WORDS, SHAPE_PLURALS, TEXTURE_PHRASES, VALUES, load_shapes
from vlctl.methods.sae.describe import normalise
from vlctl.recipes.controlembed.shapes import load_preset, stage_keys
from vlctl.recipes.shipped import SHIPPED, stage_dir_name

CONCEPTS = [(c, v) for c in CATEGORIES for v in VALUES[c]]  # the concept SAEs' latent order
FIRES = 80.0  # label-AUC (percent) from which a latent "fires for" a value (as experiments/inspect_sae_mad.py)


def caption_word(category: str, value: str) -> str:
    """The word a shapes caption uses for a value (`vlctl.data.shapes.caption`)."""
    if category == "texture":
        return TEXTURE_PHRASES[value]
    return COUNT_WORDS[int(value) - 1] if category == "count" else value


# caption word -> the value it names; a shape noun in the plural too ("cubes", "tori")
WORD_VALUE = {caption_word(c, v): (c, v) for c, v in CONCEPTS}
WORD_VALUE.update({SHAPE_PLURALS.get(v, v + "s"): ("shape", v) for v in VALUES["shape"]})


def name_values(name: str) -> set[tuple[str, str]]:
    """The attribute values a name names, word by word ("three red" -> count 3, colour red)."""
    return {WORD_VALUE[w] for w in normalise(name).split() if w in WORD_VALUE}


def _vlctl(args: list[str], out: Path) -> None:
    """Run a vlctl command unless its output is there (quiet: its --json is read back from files)."""
    if out.exists():
        return
    with contextlib.redirect_stdout(io.StringIO()):
        rc = vlctl_main([*args, "--out", str(out)])
    assert rc == 0, args


def prepare(work: Path, encoder: str) -> dict[str, Path]:
    """The sets, the stores and the three SAEs under `work` -> variant -> SAE directory."""
    cfg = load_preset(True)
    for split, n in (("train", cfg.n_train), ("test", cfg.n_test)):
        _vlctl(["data", "shapes", "--n", str(n), "--split", split, "--seed", str(cfg.seed), "--image-size",
                str(cfg.image_size)], work / f"data-{split}")
        _vlctl(["embed", str(work / f"data-{split}"), "--encoder", encoder, "--no-progress"], work / f"store-{split}")
    concepts = work / "concepts.txt"
    concepts.write_text("".join(caption_word(c, v) + "\n" for c, v in CONCEPTS), encoding="utf-8")
    common = ["fit", "sae", "--store", str(work / "store-train"), "--k", "8", "--epochs", "100", "--lr", "0.01",
              "--batch-size", "512", "--seed", "0"]
    concept_args = ["--concepts", str(concepts), "--encoder", encoder]
    fits = {"learned": ["--expansion", "4", "--aux-k", "16"],
            "concepts": [*concept_args, "--concepts-init", "--aux-k", "16"],
            "cg": [*concept_args, "--aux-k", "0"]}
    for v, extra in fits.items():
        _vlctl([*common, *extra], work / f"sae-{v}")
    return {v: work / f"sae-{v}" for v in fits}


def _share(named: list[set], fires: list[set]) -> dict:
    """Shares of the live latents: top name right (names values, all fired for), naming some value
    fired for, naming no value; and the same two among the latents that fire for some value (a
    latent firing for none, a mixture, cannot be named right)."""
    some = [i for i, f in enumerate(fires) if f]
    right = [bool(n) and n <= f for n, f in zip(named, fires)]
    hit = [bool(n & f) for n, f in zip(named, fires)]
    return {"right": float(np.mean(right)), "names_a_value_it_fires_for": float(np.mean(hit)),
            "names_no_value": float(np.mean([not n for n in named])), "fire_for_a_value": len(some),
            "right_of_those": float(np.mean([right[i] for i in some])) if some else None,
            "names_a_value_it_fires_for_of_those": float(np.mean([hit[i] for i in some])) if some else None}


def measure(work: Path, variant: str, sae_dir: Path) -> dict:
    from inspect_sae_mad import agreement, inspect  # the same run, control and check as on MAD

    data = work / "data-test"
    labels = load_shapes(data)["labels"]
    present = np.array([[str(lab[c]) == v for c, v in CONCEPTS] for lab in labels])
    got = inspect(work / "store-test", sae_dir, work / f"inspect-{variant}", data, present)
    summary, rows, sae, live, label_auc = (got[k] for k in ("summary", "rows", "sae", "live", "label_auc"))
    fires = [{CONCEPTS[j] for j in np.flatnonzero(a >= FIRES)} for a in label_auc]
    top = [rows[r]["names"][0]["name"] for r in live]
    named = [name_values(t) for t in top]
    ctrl = [name_values(n) for n in got["control"]]
    right = [bool(n) and n <= f for n, f in zip(named, fires)]
    top_auc = [rows[r]["names"][0]["auc"] for r in live]
    key = (lambda cv: f"{cv[0]}={cv[1]}")
    result = {"variant": variant, "sae": str(sae_dir), "seconds": round(got["seconds"], 2), "n_images": len(labels),
              "n_latents": got["n_latents"], "k": sae.config_.k, "live": len(live), "vocabulary": summary["vocabulary"],
              "names": _share(named, fires), "shuffled_decoder_names": _share(ctrl, fires),
              "caption_auc_check": summary["top_name"], "caption_auc_check_shuffled": summary["shuffled_decoder"],
              # the check is the AUC of the whole phrase: it can tell a name with a value the latent fires for
              "caption_auc_agrees": agreement(top_auc, [bool(n & f) for n, f in zip(named, fires)]),
              "caption_auc_agrees_strict": agreement(top_auc, right),
              "fires_for_by_category": {c: int(sum(any(cv[0] == c for cv in f) for f in fires)) for c in CATEGORIES},
              "right_by_category": {c: int(sum(r and all(cv[0] == c for cv in n) for r, n in zip(right, named)))
                                    for c in CATEGORIES},
              "latents": [{"latent": int(r), "top_name": t, "names": sorted(map(key, n)),
                           "fires_for": sorted(map(key, f)), "best": key(CONCEPTS[int(a.argmax())]),
                           "best_label_auc": float(a.max()) / 100, "caption_auc": rows[r]["names"][0]["auc"]}
                          for r, t, n, f, a in zip(live, top, named, fires, label_auc)]}
    if sae.config_.concepts_fixed or sae.config_.concepts_init:  # latent r started at concept r
        own = [CONCEPTS[r] for r in live]
        own_auc = [label_auc[i, CONCEPTS.index(o)] / 100 for i, o in enumerate(own)]
        result["own_value"] = {"named_with_own_value": int(sum(n == {o} for n, o in zip(named, own))),
                               "own_label_auc_ge_0.95": int(sum(a >= 0.95 for a in own_auc)),
                               "own_label_auc": {key(o): round(a, 4) for o, a in zip(own, own_auc)}}
    return result


def run(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("work", type=Path, help="working directory (sets, stores, SAEs, inspect outputs)")
    p.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    args = p.parse_args(argv)
    cfg = load_preset(True)
    clip = SHIPPED / stage_dir_name("train", stage_keys(cfg)["train"]) / "model"
    if not clip.is_dir():
        raise SystemExit(f"{clip}: the shipped controlembed-shapes CLIP is not there (see vlctl.recipes.shipped)")
    args.work.mkdir(parents=True, exist_ok=True)
    saes = prepare(args.work, f"tiny:{clip}")
    results = {"command": "python experiments/inspect_sae_shapes.py WORK", "clip": clip.parent.name,
               "fires_for_label_auc": FIRES / 100,
               "variants": [measure(args.work, v, d) for v, d in saes.items()]}
    args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    for v in results["variants"]:
        print(v["variant"], "live", v["live"], "of", v["n_latents"], "names", v["names"], "control",
              v["shuffled_decoder_names"], "check", v["caption_auc_agrees"], v.get("own_value", {}).get(
                  "named_with_own_value"))
    return results


if __name__ == "__main__":
    run()
