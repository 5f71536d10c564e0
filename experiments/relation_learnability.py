"""Can a from-scratch TinyCLIP learn spatial relations on the scenes set at all?

3VL's relation_spatial negatives swap the relation ("A left of B" -> "A right of B"). Scoring the
pair right needs an interaction: the text must multiply the relation's sign into its two noun
phrases and the image must multiply each object's attributes into its position. At the symmetric
start the gradient of "caption beats its swap" averages to zero over the data (every relation word
is as often the positive as the negative), so plain gradient descent can sit at ln 2.

This trains scenes-quick from random weights on a scenes train split with one of
  contrastive: CLIP InfoNCE (what the base model sees);
  negclip:     NegCLIP, each caption's relation swap as its hard negative;
  relation:    InfoNCE + CE(caption vs its relation swap);
  relation_only: CE(caption vs its relation swap) alone;
and after every epoch writes the training loss, the relation accuracy on the first 1,000
training scenes and the checklist accuracy of every category on the test split, to --out (JSON).

The image embedding is read at the class token (`--pool cls`, the TinyCLIP default) or also at
the mean of the patch tokens (`--pool cls_mean`, TinyCLIPConfig.vision_pool), so that per-token
products of content and position, summed over the image, reach the embedding without attention
having to gather them into the class token.

    python experiments/relation_learnability.py DATA --mode relation_only --epochs 12 --out rel.json

DATA holds train/ and test/ scenes directories (`vlctl data scenes`, or a 3vl-scenes data stage).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vlctl.data.scenes import CHECKLIST_CATEGORIES, OPPOSITE_RELATION, load_checklist, load_scenes, render_caption
from vlctl.encoders import tiny_encoder, tiny_model
from vlctl.encoders.loss import clip_loss
from vlctl.encoders.tiny_model import sincos_2d
from vlctl.eval.checklist import checklist_scores
from vlctl.eval.metrics import checklist_accuracy
from vlctl.io import atomic_write_json
from vlctl.methods.threevl.tree_tune import negclip_loss, trim_padding

MODES = ("contrastive", "negclip", "relation", "relation_only")


def swapped(label: dict) -> str:
    st = label["structure"]
    return render_caption({**st, "rel": OPPOSITE_RELATION[st["rel"]]})


def pair_accuracy(img: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor) -> float:
    """% of rows where cos(image, positive) > cos(image, negative) (unit-norm inputs)."""
    return 100.0 * float(((img * pos).sum(1) > (img * neg).sum(1)).float().mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("--mode", choices=MODES, default="relation_only")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--model", default="scenes-quick")
    ap.add_argument("--vision-pos-init", choices=("normal", "sincos2d"), default="normal",
                    help="the ViT's initial positional embedding: CLIP's N(0, 0.01^2) or MAE's 2D sin-cos table")
    ap.add_argument("--pool", choices=("cls", "cls_mean"), default="cls",
                    help="read the image embedding at the class token, or there and at the patch tokens' mean")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    train, test = load_scenes(args.data / "train"), load_scenes(args.data / "test")
    model = tiny_model.create_model(args.model, seed=args.seed, vision_pool=args.pool)
    if args.vision_pos_init == "sincos2d":  # overwrite after the draws: every other weight's init is unchanged
        pos = model.visual.positional_embedding
        with torch.no_grad():
            pos[0].zero_()
            pos[1:] = sincos_2d(math.isqrt(pos.shape[0] - 1), pos.shape[1])
    x = tiny_model.preprocess_batch(np.asarray(train["images"]))
    pos = model.tokenize([lab["caption"] for lab in train["labels"]])
    neg = model.tokenize([swapped(lab) for lab in train["labels"]])
    x_test = tiny_model.preprocess_batch(np.asarray(test["images"]))
    items = {c: load_checklist(args.data / "test", c) for c in CHECKLIST_CATEGORIES}

    params = [p for name, p in model.named_parameters() if name != "logit_scale"]
    opt = torch.optim.AdamW([{"params": params, "lr": args.lr},
                             {"params": [model.logit_scale], "lr": 1e-2, "weight_decay": 0.0}], weight_decay=0.1)
    n, bs = len(pos), args.batch_size
    steps = args.epochs * (n // bs)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * 0.5 * (1 + np.cos(np.pi * min(s, steps) / steps)))

    def evaluate() -> dict:
        model.eval()
        with torch.no_grad():
            first = torch.arange(min(1000, n))
            img = model.encode_image(x[first], normalize=True)
            out = {"train_relation": pair_accuracy(img, model.encode_text(trim_padding(pos[first]), normalize=True),
                                                   model.encode_text(trim_padding(neg[first]), normalize=True))}
        out.update({c: checklist_accuracy(s)
                    for c, s in checklist_scores(tiny_encoder.TinyCLIPEncoder(model), x_test, items).items()})
        model.train()
        return out

    history, t0 = [], time.perf_counter()
    for epoch in range(args.epochs):
        perm, losses = torch.randperm(n), []
        for b0 in range(0, n - bs + 1, bs):
            i = perm[b0 : b0 + bs]
            img = model.encode_image(x[i], normalize=True)
            txt = model.encode_text(trim_padding(pos[i]), normalize=True)
            scale = model.logit_scale.exp().clamp(max=100)
            if args.mode == "contrastive":
                loss = clip_loss(img, txt, scale)
            else:
                sw = model.encode_text(trim_padding(neg[i]), normalize=True)
                if args.mode == "negclip":
                    loss = negclip_loss(img, txt, sw, torch.ones(len(i), dtype=torch.bool), scale)
                else:
                    pair = scale * torch.stack([(img * txt).sum(1), (img * sw).sum(1)], dim=1)
                    loss = F.cross_entropy(pair, torch.zeros(len(i), dtype=torch.long))
                    if args.mode == "relation":
                        loss = loss + clip_loss(img, txt, scale)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
        history.append({"epoch": epoch + 1, "loss": float(np.mean(losses)), **evaluate(),
                        "seconds": time.perf_counter() - t0})
        print(json.dumps(history[-1]), flush=True)
    atomic_write_json(args.out, {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                                 "ln2": float(np.log(2)), "history": history})


if __name__ == "__main__":
    main()
