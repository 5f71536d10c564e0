"""TEVI as its paper specifies it, on MAD (issue 41, Deliver 1-2, the quick CLIP).

Three SAEs under the paper's mask (3 layers, hidden 256, ReLU, plain sigmoid, no floor; AdamW lr
1e-2, 25 epochs, 5 warmup; Eq. 10), each with the text tower frozen and fine-tuned at 1e-6 through
the mask's loss (`TeviMadRecipe.text_finetune`), over the recipe's own `_fit_sae`, `_fit_tevi`,
`_evaluate_variant`:

  concepts  26 latents, decoder started at the values' normalised (centred) text embeddings, trained
            (`sae_init="concepts"`: the reading the recipe option takes)
  random26  26 latents, random start (the other reading of "keep them learnable")
  cg        the CG-SAE (decoder fixed at the concepts; Table A1's proof) under the same free mask

Then, the diagnosis:

  losses    on the training pairs, the InfoNCE of the learned mask, of no mask (all ones) and of
            the oracle category mask (keeps exactly the latents of the categories the caption
            names), under Eq. 10, Eq. 11 and their mean, at the learned mask's temperature and at
            each mask's best temperature (grid), over the concept-started SAE and the CG-SAE;
  drift     the mask started at the oracle (the MLP regressed onto the oracle masks) and trained on
            under Eq. 10 / Eq. 11 / both with the paper's schedule: per epoch the training loss,
            its distance to the oracle, not-in-caption excess, follows-image and follows-caption.

    PYTHONPATH=src python experiments/tevi_paper_config.py --stages /tmp/t41b/stages \\
        --arrays /tmp/t41b-paper --seeds 0 1 2

(`--stages`: a `vlctl reproduce tevi-mad --quick --out /tmp/t41b` run's stage cache; with `--preset full`
a full-preset run's, the paper's CLIP, e.g. `--out experiments/tevi_paper_config_full`.) Writes
experiments/tevi_paper_config/results.json (every figure below), drift.npz and losses.npz (the
per-epoch and per-mask arrays they print); each config's test arrays (edited embeddings, top-10
orders; the recipe's arrays/) go under --arrays/<config>/, too large for the repository: rerun to
recompute them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vlctl.data.mad import CATEGORIES, load_mad
from vlctl.encoders.factory import load_encoder
from vlctl.encoders.loss import clip_loss
from vlctl.eval.editing import conditioning_accuracy, leakage_accuracy
from vlctl.io import atomic_save_npz, atomic_write_json
from vlctl.methods.sae.model import SparseAutoencoder
from vlctl.methods.tevi.config import TeviConfig
from vlctl.methods.tevi.estimator import TEVI, TeviMask, edit
from vlctl.methods.tevi.scoring import conditioned_scores
from vlctl.recipes.runner import find_stage
from vlctl.recipes.tevi import mad as recipe
from vlctl.recipes.tevi import mad_clip
from vlctl.train.loop import lr_multiplier

EDITED = [c for c in CATEGORIES if c != "digit"]
PAPER_MASK = {"mask_hidden": 256, "mask_temperature": 1.0, "mask_floor": 0.0, "mask_lr": 1e-2, "mask_epochs": 25,
              "mask_warmup_epochs": 5}
SCALES = np.exp(np.linspace(0.0, math.log(100.0), 25))  # InfoNCE temperatures tried for each mask's best loss


def summary(img, edited, swapped, test, img_vals, cap_vals, perm, classes="text") -> dict:
    """Excess, in-caption gap, follows-image min/mean, follows-caption mean (the recipe's summary)."""
    cond, leak = {}, {}
    for c in EDITED:
        ci = CATEGORIES.index(c)
        cls = test[f"{classes}_{c}"]
        cond[c] = conditioning_accuracy(img, edited, cls, img_vals[:, ci], cap_vals[:, ci] >= 0)
        leak[c] = leakage_accuracy(swapped, cls, img_vals[:, ci], cap_vals[perm, ci])
    return {"not_in_caption_excess": float(np.mean([cond[c]["not_in_caption"] - cond[c]["chance"] for c in EDITED])),
            "in_caption_gap": float(np.mean([cond[c]["original"] - cond[c]["in_caption"] for c in EDITED])),
            "follows_image_min": float(min(leak[c]["follows_image"] for c in EDITED)),
            "follows_image_mean": float(np.mean([leak[c]["follows_image"] for c in EDITED])),
            "follows_caption_mean": float(np.mean([leak[c]["follows_caption"] for c in EDITED])),
            "follows_image": {c: leak[c]["follows_image"] for c in EDITED}}


def oracle_masks(cap_vals: np.ndarray) -> torch.Tensor:
    """(n, 26): 1 on the latents of every category the caption names (CATEGORIES x VALUES order)."""
    cats = np.array(recipe.concept_categories())
    return torch.as_tensor((cap_vals[:, cats] >= 0).astype(np.float32))


def fixed_mask_eval(sae, masks_test: torch.Tensor, test, img_vals, cap_vals, perm) -> dict:
    """A given mask per test caption (e.g. the oracle): summary and exhaustive t2i@1 / i2t@1."""
    from vlctl.eval.metrics import caption_relevance, recall_at_k_relevant

    m = sae.model_
    img, txt = test["image_emb"], test["text_emb"]
    z = sae.encode(img)
    edited = edit(z, masks_test, m.W_D, m.b_pre).detach().numpy()
    swapped = edit(z, masks_test[perm], m.W_D, m.b_pre).detach().numpy()
    with torch.no_grad():
        s = conditioned_scores(z, masks_test, m.W_D, m.b_pre, torch.as_tensor(txt), k=m.cfg.k).numpy()
    rec = recall_at_k_relevant(s, caption_relevance(img_vals, cap_vals))
    return {**summary(img, edited, swapped, test, img_vals, cap_vals, perm),
            "words": summary(img, edited, swapped, test, img_vals, cap_vals, perm, "word"),
            "t2i@1": rec["t2i@1"], "i2t@1": rec["i2t@1"]}


# --- the training-pair losses -------------------------------------------------------------------


def batch_losses(z, m, t, W, b, scales) -> np.ndarray:
    """(len(scales), 2): Eq. 10 and Eq. 11 of one batch at each InfoNCE scale (the trainer's losses)."""
    e = F.normalize(edit(z, m, W, b), dim=-1)
    tn = F.normalize(t, dim=-1)
    cos = conditioned_scores(z, m, W, b, t, chunk_size=1024)  # S[i, j] = cos(e_{i|j}, t_j)
    target = torch.arange(len(z))
    out = []
    for s in scales:
        eq10 = clip_loss(e, tn, float(s))
        S = float(s) * cos
        eq11 = (F.cross_entropy(S, target) + F.cross_entropy(S.T, target)) / 2
        out.append([float(eq10), float(eq11)])
    return np.array(out)


@torch.no_grad()
def training_losses(sae, masks: dict, t_by_mask: dict, n: int, batch: int = 256) -> dict:
    """Mean Eq. 10 / Eq. 11 / mean loss over the training batches (seed-0 order, drop_last) of each
    mask (callable: rows -> (b, d1)), at every scale in SCALES."""
    m = sae.model_
    order = np.random.default_rng([0, 0]).permutation(n)
    z_all = None
    out = {}
    for name, mask_fn in masks.items():
        t_all = t_by_mask[name]
        acc = np.zeros((len(SCALES), 2))
        nb = n // batch
        for bi in range(nb):
            rows = order[bi * batch:(bi + 1) * batch]
            if z_all is None:
                z_all = sae.encode(t_by_mask["_images"])
            acc += batch_losses(z_all[rows], mask_fn(rows), t_all[rows], m.W_D, m.b_pre, SCALES)
        out[name] = acc / nb  # (scales, 2)
    return out


# --- the oracle-started mask --------------------------------------------------------------------


def oracle_start(cfg: TeviConfig, t: torch.Tensor, oracle: torch.Tensor, epochs: int = 30) -> TeviMask:
    """A TeviMask regressed (BCE, AdamW lr 1e-3) onto the oracle masks of the training captions."""
    torch.manual_seed(cfg.seed)
    mask = TeviMask(cfg)
    opt = torch.optim.AdamW(mask.mlp.parameters(), lr=1e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        for rows in torch.randperm(len(t), generator=gen).split(256):
            loss = F.binary_cross_entropy(mask(t[rows]), oracle[rows])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return mask


def drift(sae, mask: TeviMask, x, t, oracle_tr, test, img_vals, cap_vals, perm, epochs=25, warmup=5,
          lr=1e-2, batch=256) -> list[dict]:
    """Train `mask` on (x, t) with the paper's schedule (AdamW, linear warmup, cosine) under its
    cfg.conditioning; per epoch (0 = the start) the loss, |m - oracle|, and the test summary."""
    from vlctl.methods.tevi.estimator import _TeviTrainer

    m = sae.model_
    net = _TeviTrainer(mask, m.W_D, m.b_pre, None)
    z = sae.encode(x)
    opt = torch.optim.AdamW(mask.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98), eps=1e-6)
    per_epoch = len(x) // batch
    total = epochs * per_epoch
    z_te = sae.encode(test["image_emb"])
    t_te = torch.as_tensor(test["text_emb"])
    log, step = [], 0

    def record(epoch: int, loss: float) -> None:
        mask.eval()
        with torch.no_grad():
            mt = mask(t_te)
            edited = edit(z_te, mt, m.W_D, m.b_pre).numpy()
            swapped = edit(z_te, mt[perm], m.W_D, m.b_pre).numpy()
            dist = float((mask(t[:5000]) - oracle_tr[:5000]).abs().mean())
        s = summary(test["image_emb"], edited, swapped, test, img_vals, cap_vals, perm)
        log.append({"epoch": epoch, "loss": loss, "oracle_distance": dist, **{k: s[k] for k in (
            "not_in_caption_excess", "in_caption_gap", "follows_image_min", "follows_image_mean",
            "follows_caption_mean")}})
        mask.train()

    record(0, float("nan"))
    for epoch in range(epochs):
        order = torch.as_tensor(np.random.default_rng([mask.cfg.seed, epoch]).permutation(len(x)))
        losses = []
        for bi in range(per_epoch):
            rows = order[bi * batch:(bi + 1) * batch]
            for g in opt.param_groups:
                g["lr"] = lr * lr_multiplier(step, warmup_steps=warmup * per_epoch, total_steps=total, min_lr_ratio=0.0)
            loss, _ = net(z[rows], t[rows])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
            step += 1
        record(epoch + 1, float(np.mean(losses)))
    return log


# --- main ---------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stages", type=Path, required=True)
    ap.add_argument("--arrays", type=Path, required=True, help="where each config's test arrays go")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("tevi_paper_config"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--configs", nargs="+", default=["concepts", "random26", "cg"])
    ap.add_argument("--finetune", nargs="+", default=["frozen", "finetuned"])
    ap.add_argument("--parts", nargs="+", default=["configs", "losses", "drift"])
    ap.add_argument("--conditioning", choices=("positive", "negative", "both"), default="positive",
                    help="the configs' mask objective: Eq. 10 (the paper's), Eq. 11, or their mean; runs "
                         "other than Eq. 10 are keyed NAME/FT-CONDITIONING/seedS")
    ap.add_argument("--preset", choices=("quick", "full"), default="quick",
                    help="the preset whose stages --stages holds: quick (d = 32 CLIP) or full (the paper's CLIP)")
    args = ap.parse_args()
    quick = args.preset == "quick"
    torch.set_num_threads(1)
    t0 = time.perf_counter()

    base = recipe.load_preset(quick)
    cfg = dataclasses.replace(base, **PAPER_MASK, conditioning=args.conditioning)
    cond = "" if args.conditioning == "positive" else f"-{args.conditioning}"
    train = dict(np.load(find_stage(args.stages, "embed-train") / "embeddings.npz"))
    test = dict(np.load(find_stage(args.stages, "embed") / "embeddings.npz"))
    test = {**test, **{f"word_{c}": test[f"word_{c}"] / np.linalg.norm(test[f"word_{c}"], axis=1, keepdims=True)
                       for c in CATEGORIES}}
    concepts = recipe._concepts(test)
    labels = load_mad(find_stage(args.stages, "data-test") / "test")["labels"]
    img_vals, cap_vals = mad_clip.image_values(labels), mad_clip.caption_values(labels)
    clip_cfg = mad_clip.load_preset(quick)
    clip = load_encoder(find_stage(args.stages, "train") / "model")
    split = mad_clip.split_key(clip_cfg, "train")
    from vlctl.data.mad import captions
    from vlctl.data.mad_config import MadConfig

    train_caps = captions(MadConfig(n=split["n"], seed=split["seed"], split="train"))
    fit_text = (clip.model.text, clip.tokenize(train_caps))
    eval_text = (clip.model.text, clip.tokenize, [lab["caption"] for lab in labels])
    perm = np.random.default_rng(cfg.seed).permutation(len(test["image_emb"]))
    with np.load(find_stage(args.stages, "values-train") / "values.npz") as z:
        train_cap_vals = z["caption_values"].astype(np.int64)
    encoder_id = json.loads((find_stage(args.stages, "embed") / "encoder.json").read_text())["encoder_id"]

    args.out.mkdir(parents=True, exist_ok=True)
    res_path = args.out / "results.json"
    results = json.loads(res_path.read_text()) if res_path.is_file() else {}
    results.update({"stages": str(args.stages), "preset": args.preset, "paper_mask": PAPER_MASK, "sae": {
        "k": cfg.sae_k, "aux_k": cfg.sae_aux_k, "epochs": cfg.sae_epochs, "lr": cfg.sae_lr}})
    results.setdefault("runs", {})
    saes = {}

    def fit_sae(name: str, seed: int) -> SparseAutoencoder:
        if (name, seed) in saes:
            return saes[name, seed]
        work = args.arrays / f"sae-{name}-seed{seed}"
        if (work / "sae" / "config.json").is_file():
            saes[name, seed] = SparseAutoencoder.load(work / "sae")
            return saes[name, seed]
        if name == "random26":  # the same fit as the recipe's learned SAE, 26 latents, random start
            sae = SparseAutoencoder(k=cfg.sae_k, d_latent=26, aux_k=cfg.sae_aux_k, epochs=cfg.sae_epochs,
                                    lr=cfg.sae_lr, batch_size=cfg.sae_batch_size, seed=seed,
                                    dead_after=20 * len(train["image_emb"]) // 30)
            torch.set_num_threads(1)
            sae.fit(train["image_emb"], encoder_id)
            sae.save(work / "sae")
        else:
            variant = "cg" if name == "cg" else "learned"
            recipe._fit_sae(dataclasses.replace(cfg, sae_init="concepts"), variant, train["image_emb"], concepts,
                            encoder_id, work, seed=seed)
        saes[name, seed] = SparseAutoencoder.load(work / "sae")
        return saes[name, seed]

    def tevi_dir(name: str, ft: str, seed: int) -> Path:
        work = args.arrays / f"tevi-{name}-{ft}{cond}-seed{seed}"
        if not (work / "tevi" / "config.json").is_file():
            fit_sae(name, seed)
            c = dataclasses.replace(cfg, text_finetune=ft == "finetuned")
            recipe._fit_tevi(c, args.arrays / f"sae-{name}-seed{seed}" / "sae", train, work, "learned", None, seed,
                             text=recipe._copy(fit_text) if ft == "finetuned" else None)
        return work / "tevi"

    if "configs" in args.parts:
        for name in args.configs:
            for ft in args.finetune:
                for seed in args.seeds:
                    key = f"{name}/{ft}{cond}/seed{seed}"
                    if key in results["runs"]:
                        continue
                    d = tevi_dir(name, ft, seed)
                    r = recipe._evaluate_variant(cfg, d, test, img_vals, cap_vals, args.arrays / f"eval-{name}-{ft}{cond}",
                                                 name, seed=seed, text=eval_text if ft == "finetuned" else None)
                    r.pop("_cos", None)
                    sae = fit_sae(name, seed)
                    results["runs"][key] = {"summary": r["summary"], "alignment": r["alignment"],
                                            "retrieval": {k: r["retrieval"]["tevi"][k] for k in ("t2i@1", "i2t@1")},
                                            "leakage": {c: r["leakage"][c]["follows_image"] for c in EDITED},
                                            "conditioning": r["conditioning"], "fvu_train": sae.fvu_,
                                            "dead": sae.n_dead_}
                    print(key, json.dumps({k: round(v, 1) for k, v in r["summary"].items()}),
                          results["runs"][key]["retrieval"], f"{time.perf_counter() - t0:.0f}s", flush=True)
                    atomic_write_json(res_path, results)
        for name in ("concepts", "cg"):
            if name in args.configs:
                results.setdefault("oracle", {})[name] = fixed_mask_eval(
                    fit_sae(name, args.seeds[0]), oracle_masks(cap_vals), test, img_vals, cap_vals, perm)
                print("oracle", name, {k: v for k, v in results["oracle"][name].items() if k != "words"}, flush=True)
        atomic_write_json(res_path, results)

    x_tr = torch.as_tensor(train["image_emb"])
    t_tr = torch.as_tensor(train["text_emb"])
    oracle_tr = oracle_masks(train_cap_vals)
    if "losses" in args.parts:
        arrays, table = {}, {}
        for name in ("concepts", "cg"):
            seed = args.seeds[0]
            sae = fit_sae(name, seed)
            frozen = TEVI.load(tevi_dir(name, "frozen", seed))
            tuned = TEVI.load(tevi_dir(name, "finetuned", seed), text_encoder=recipe._copy(fit_text)[0])
            with torch.no_grad():
                t_ft = torch.cat([tuned.text_encoder_(fit_text[1][i:i + 4096]) for i in range(0, len(x_tr), 4096)])
                m_fr = frozen.masks(t_tr)
                m_ft = tuned.mask_(t_ft)
            masks = {"learned": lambda r, m=m_fr: m[r], "learned_text_finetuned": lambda r, m=m_ft: m[r],
                     "no_mask": lambda r: torch.ones(len(r), 26), "oracle": lambda r: oracle_tr[r]}
            t_by = {"learned": t_tr, "learned_text_finetuned": t_ft, "no_mask": t_tr, "oracle": t_tr, "_images": x_tr}
            losses = training_losses(sae, masks, t_by, len(x_tr))
            s_learned = float(frozen.mask_.scale())
            i_learned = int(np.argmin(np.abs(SCALES - s_learned)))
            table[name] = {"learned_scale": s_learned, "scale_used": float(SCALES[i_learned]), **{
                m: {"at_learned_scale": {"eq10": float(v[i_learned, 0]), "eq11": float(v[i_learned, 1]),
                                         "mean": float(v[i_learned].mean())},
                    "best": {"eq10": float(v[:, 0].min()), "eq11": float(v[:, 1].min()),
                             "mean": float(v.mean(1).min())}} for m, v in losses.items()}}
            arrays.update({f"{name}_{m}": v for m, v in losses.items()})
            print("losses", name, json.dumps(table[name], indent=None), flush=True)
        atomic_save_npz(args.out / "losses.npz", scales=SCALES, **arrays)
        results["losses"] = table
        atomic_write_json(res_path, results)

    if "drift" in args.parts:
        sae = fit_sae("concepts", args.seeds[0])
        tcfg = TeviConfig(d=x_tr.shape[1], n_latents=26, hidden=256, mask_temperature=1.0, mask_floor=0.0, seed=args.seeds[0])
        start = oracle_start(tcfg, t_tr, oracle_tr)
        logs, arrays = {}, {}
        for cond in ("positive", "negative", "both"):
            mask = TeviMask(dataclasses.replace(tcfg, conditioning=cond))
            mask.load_state_dict(start.state_dict())
            logs[cond] = drift(sae, mask, x_tr, t_tr, oracle_tr, test, img_vals, cap_vals, perm)
            for k in logs[cond][0]:
                arrays[f"{cond}_{k}"] = np.array([row[k] for row in logs[cond]])
            print("drift", cond, [(r["epoch"], round(r["not_in_caption_excess"], 1), round(r["follows_image_mean"], 1),
                                   round(r["follows_caption_mean"], 1), round(r["oracle_distance"], 3))
                                  for r in logs[cond]], flush=True)
        atomic_save_npz(args.out / "drift.npz", **arrays)
        results["drift"] = logs
        atomic_write_json(res_path, results)
    print(f"done in {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
