"""Issue 46, Deliver 4: are the names `vlctl inspect sae` gives an SAE's latents right, where the truth
is known? On MAD's test set (5000 images, the quick MAD CLIP), for the SAEs of the tevi-mad recipe's
quick preset: the CG-SAE (one latent per attribute value, decoder fixed), the learned TopK SAE (the
default since issue 41: 26 latents started at the concepts, every weight trained) and the
random-start 26-latent SAE (`random_reading`, the other reading). The RUN's stages are those of the
current preset (`_stage` picks by the preset's key, so a RUN holding older SAEs is read right).

For each live latent: its top name (the nearest caption phrase to its decoder row, as the command
gives it) against the attribute value it fires for, from MAD's labels: the value whose label-AUC
(ROC AUC of the latent's activation for "the image has value v", `eval.editing.concept_auc_matrix`)
is highest. Reported: the share of live latents whose top name is that value, and the share whose
top name is any value it fires for (label-AUC >= 0.8), beside the control: the names of a shuffled
decoder (each live latent named by another live latent's row, `describe.shuffled_rows`, seed 0),
scored the same way. For the SAEs started at the concepts (CG-SAE, learned) also: how many latents
are named with their own value (the concept their row started at), and their own value's label-AUC
and caption-AUC (the command's check: images whose caption mentions the
name against the rest; a MAD caption names 3 of the 5 non-digit attributes, so an image can have the
value without its caption saying so).

    vlctl reproduce tevi-mad --quick --out RUN     # stages data-test, embed, sae, cg-sae, sae-random are read
    python experiments/inspect_sae_mad.py RUN [--out experiments/inspect_sae_mad.json]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import time
from pathlib import Path

import numpy as np

from vlctl.cli import main as vlctl_main
from vlctl.data.mad import CATEGORIES, VALUES, load_mad
from vlctl.embeddings.store import open_store
from vlctl.eval.editing import concept_auc_matrix
from vlctl.methods.sae.describe import (
    embed_names,
    nearest_names,
    normalise,
    shuffled_rows,
    store_encoder,
    store_vocabulary,
)
from vlctl.methods.sae.model import SparseAutoencoder
from vlctl.recipes.tevi.mad import load_preset

CONCEPTS = [v for c in CATEGORIES for v in VALUES[c]]  # the CG-SAE's latent order
FIRES = 80.0  # label-AUC (percent) from which a latent "fires for" a value


def _stage(run: Path, name: str, **want) -> Path:
    """The finished stage `name` whose key holds `want` (the preset's settings of that stage)."""
    [d] = [p for p in (run / "stages").glob(f"{name}-" + "?" * 12) if (p / "done.json").is_file()
           and want.items() <= json.loads((p / "done.json").read_text())["key"].items()]
    return d


def _sae_keys() -> dict[str, tuple[str, dict]]:
    """variant -> (stage, the key entries the quick preset gives it): the learned SAE's start and
    size change with the preset (issue 41), so the RUN's stage is picked by them."""
    cfg = load_preset(True)
    common = {"k": cfg.sae_k, "epochs": cfg.sae_epochs, "seed": cfg.seed}
    return {"cg": ("cg-sae", {"k": cfg.cg_k, "epochs": cfg.cg_epochs, "seed": cfg.seed}),
            "learned": ("sae", {**common, "expansion": cfg.sae_expansion,
                                **({"init": "concepts"} if cfg.sae_init == "concepts" else {})}),
            "random": ("sae-random", {**common, "init": "random"})}


def _share(names: list[str], best: list[str], fires: list[set[str]]) -> dict:
    return {"top_name_is_best_value": float(np.mean([n == b for n, b in zip(names, best)])),
            "top_name_is_a_value_it_fires_for": float(np.mean([n in f for n, f in zip(names, fires)]))}


def agreement(caption_auc: list[float | None], correct: list[bool]) -> dict:
    """Does the command's check (the top name's caption-AUC) tell the rightly named latents from the
    others? The share of latents where "caption-AUC >= FIRES" and "the top name is a value the latent
    fires for" (label-AUC >= FIRES) agree, and the mean caption-AUC of each group."""
    auc = np.array([np.nan if a is None else a for a in caption_auc])
    ok = np.array(correct, bool)
    mean = (lambda x: float(np.nanmean(x)) if np.isfinite(x).any() else None)
    return {"agree": float(np.mean((auc >= FIRES / 100) == ok)), "caption_auc_mean_right": mean(auc[ok]),
            "caption_auc_mean_wrong": mean(auc[~ok]), "right": int(ok.sum()), "wrong": int((~ok).sum())}


def inspect(store_dir: Path, sae_dir: Path, out: Path, data: Path, present: np.ndarray) -> dict:
    """`vlctl inspect sae` run and read back, with what a measure over labels needs: its seconds,
    summary and rows, the SAE, the live latents (firing on some image), their label-AUCs (live,
    concepts) in percent against `present` (images, concepts), and the control: each live latent's
    top name from the shuffled decoder. Shared with experiments/inspect_sae_shapes.py."""
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the command's summary: read back from summary.json
        rc = vlctl_main(["inspect", "sae", "--store", str(store_dir), "--sae", str(sae_dir), "--out", str(out),
                         "--data", str(data), "--overwrite", "--json"])
    seconds = time.perf_counter() - t0
    assert rc == 0
    store = open_store(store_dir)
    sae = SparseAutoencoder.load(sae_dir, encoder_id=store.encoder_id)
    z = sae.encode(np.asarray(store.image_emb)).numpy()
    live = np.flatnonzero((z > 0).any(0))
    # the control: each live latent named by another live latent's decoder row
    names, _ = store_vocabulary(store)
    names, name_emb, _ = embed_names(store_encoder(store), names)
    perm = shuffled_rows(z.shape[1], (z > 0).any(0), seed=0)
    ctrl_idx, _ = nearest_names(sae.model_.W_D.detach().numpy()[perm[live]], name_emb, 1)
    return {"seconds": seconds, "summary": json.loads((out / "summary.json").read_text()),
            "rows": [json.loads(ln) for ln in (out / "latents.jsonl").read_text().splitlines()], "sae": sae,
            "n_latents": int(z.shape[1]), "live": live, "label_auc": concept_auc_matrix(z[:, live], present),
            "control": [names[i] for i in ctrl_idx[:, 0]]}


def measure(run: Path, variant: str, stage: str, work: Path, key: dict) -> dict:
    data = _stage(run, "data-test") / "test"
    sae_dir = _stage(run, stage, **key) / "sae"
    labels = load_mad(data)["labels"]
    present = np.array([[str(lab[c]) == v for c in CATEGORIES for v in VALUES[c]] for lab in labels])
    got = inspect(next((_stage(run, "embed") / "cache").iterdir()), sae_dir, work / f"inspect-{variant}", data,
                  present)
    summary, rows, sae, live, label_auc = (got[k] for k in ("summary", "rows", "sae", "live", "label_auc"))
    started_at_concepts = sae.config_.concepts_fixed or sae.config_.concepts_init
    best = [CONCEPTS[j] for j in label_auc.argmax(1)]
    fires = [{CONCEPTS[j] for j in np.flatnonzero(a >= FIRES)} for a in label_auc]
    top = [normalise(rows[r]["names"][0]["name"]) for r in live]
    ctrl = [normalise(n) for n in got["control"]]
    result = {"variant": variant, "sae": str(sae_dir), "seconds": round(got["seconds"], 2), "n_images": len(labels),
              "start": "concepts" if started_at_concepts else "random", "fixed_decoder": sae.config_.concepts_fixed,
              "n_latents": got["n_latents"], "live": len(live), "vocabulary": summary["vocabulary"],
              "names": _share(top, best, fires), "shuffled_decoder_names": _share(ctrl, best, fires),
              "caption_auc_check": summary["top_name"], "caption_auc_check_shuffled": summary["shuffled_decoder"],
              "caption_auc_agrees": agreement([rows[r]["names"][0]["auc"] for r in live],
                                              [t in f for t, f in zip(top, fires)]),
              "latents": [{"latent": int(r), "top_name": t, "best_value": b, "best_label_auc": float(a.max()) / 100,
                           "caption_auc": rows[r]["names"][0]["auc"], "fires_for": sorted(f)}
                          for r, t, b, a, f in zip(live, top, best, label_auc, fires)]}
    if started_at_concepts:  # latent r started at concept r: is it still named so, and does it fire for it?
        own = [CONCEPTS[r] for r in live]
        own_label_auc = [label_auc[i, CONCEPTS.index(o)] / 100 for i, o in enumerate(own)]
        result["own_value"] = {
            "named_with_own_value": int(sum(t == o for t, o in zip(top, own))),
            "own_label_auc_ge_0.95": int(sum(a >= 0.95 for a in own_label_auc)),
            "own_caption_auc_ge_0.95": int(sum((rows[r]["names"][0]["auc"] or 0) >= 0.95 for r in live)),
            "own_label_auc": dict(zip(own, (round(a, 4) for a in own_label_auc)))}
    return result


def run(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="the output directory of `vlctl reproduce tevi-mad --quick`")
    p.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    p.add_argument("--work", type=Path, default=None, help="where the inspect outputs go (default: RUN/inspect)")
    args = p.parse_args(argv)
    work = args.work or args.run / "inspect"
    results = {"command": "python experiments/inspect_sae_mad.py RUN (RUN: vlctl reproduce tevi-mad --quick)",
               "fires_for_label_auc": FIRES / 100,
               "variants": [measure(args.run, v, stage, work, key) for v, (stage, key) in _sae_keys().items()]}
    args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    for v in results["variants"]:
        print(v["variant"], "live", v["live"], "names", v["names"], "control", v["shuffled_decoder_names"],
              "check", v["caption_auc_agrees"],
              v.get("own_value", {}).get("named_with_own_value"), v.get("own_value", {}).get("own_label_auc_ge_0.95"))
    return results


if __name__ == "__main__":
    run()
