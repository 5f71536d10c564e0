"""GPU smoke test of the real recipes' heavy stages at the papers' sizes, with random weights.

    python scripts/gpu_smoke.py --out benchmarks/gpu_smoke.json                     # one GPU, < 8 min
    python scripts/gpu_smoke.py --device cpu --model vlctl-tiny-vit --steps 2 --n-images 64 --out /tmp/smoke.json

Measures, for OpenCLIP `--model` (default ViT-B-16, 224 px) with random weights:
- embedding: images/s of the recipes' extraction path (JPEG files decoded by DataLoader workers,
  OpenCLIP's transform, `--precision` autocast) and of the raw forward pass on preprocessed tensors;
- SAE (tevi-coco): samples/s of the TopK SAE (K=128, AuxK 256, expansion 32, batch 4096);
- TEVI mask (tevi-coco): steps/s of the negative-conditioned mask (batch 256);
- LoRA (3vl-coco): steps/s of rank-1 peft LoRA fine-tuning at batch 64 for the contrastive,
  NegCLIP and tree losses (trees of 4 levels x 1 + 8 candidates, the paper's max);
- ControlEmbed (controlembed-*): hypernetwork steps/s at the encoder's embedding dimension;
- peak GPU memory of each;
and writes them, with the expected wall time of each paper experiment on this device derived from
the measured rates, to `--out` (JSON). Nothing downloads.
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

# Dataset sizes of the paper experiments (for the expected times).
COCO_TRAIN_IMAGES, COCO_TRAIN_CAPTIONS = 113_287, 566_747
CC12M_PAIRS = 10_000_000  # what survives of CC12M's 12.4M URLs, typically
CLEVR4_IMAGES = 10_000
THREE_VL_EPOCHS, THREE_VL_BATCH = 12, 64
SAE_EPOCHS, SAE_BATCH, MASK_EPOCHS, MASK_BATCH = 50, 4096, 10, 256
CONTROLEMBED_STEPS = 6000


def _peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) / 2**30


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _jpegs(folder: Path, n: int, side: int = 256) -> list[Path]:
    from PIL import Image

    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
    paths = []
    for i in range(n):
        img = np.roll(base, i, axis=1)  # distinct files, one random draw
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=90)
        p = folder / f"{i:06d}.jpg"
        p.write_bytes(buf.getvalue())
        paths.append(p)
    return paths


def embedding(args, device: torch.device) -> tuple[dict, object]:
    from vlctl.embeddings.extract import embed_image_files
    from vlctl.embeddings.extract_config import ExtractConfig
    from vlctl.encoders.factory import create

    enc = create(f"open_clip:{args.model}", device=str(device), precision=args.precision,
                 batch_size=args.embed_batch_size)
    out: dict = {"model": args.model, "image_size": enc.image_size, "precision": args.precision,
                 "batch_size": args.embed_batch_size, "workers": args.workers, "n_images": args.n_images}
    with tempfile.TemporaryDirectory(prefix="vlctl-gpu-smoke-") as tmp:
        paths = _jpegs(Path(tmp), args.n_images)
        cfg = ExtractConfig(batch_size=args.embed_batch_size, workers=args.workers)
        embed_image_files(enc, paths[: min(len(paths), args.embed_batch_size)], cfg, progress=False)  # warm-up
        _peak_reset(device)
        res = embed_image_files(enc, paths, cfg, progress=False)
        out["pipeline_images_per_s"] = len(res.ok) / res.seconds
        out["pipeline_peak_gib"] = _peak(device)
    x = torch.randn(args.embed_batch_size, 3, enc.image_size, enc.image_size)
    enc.encode_images(x)  # warm-up
    _peak_reset(device)
    t0 = time.perf_counter()
    n = 0
    while n < args.n_images:
        enc.encode_images(x)
        n += len(x)
    _sync(device)
    out["forward_images_per_s"] = n / (time.perf_counter() - t0)
    out["forward_peak_gib"] = _peak(device)
    return out, enc


def sae_and_tevi(args, device: torch.device, d: int) -> tuple[dict, dict]:
    from vlctl.methods.sae.model import SparseAutoencoder
    from vlctl.methods.tevi.estimator import TEVI

    rng = np.random.default_rng(0)
    batch = min(SAE_BATCH, args.sae_batch_size)
    x = rng.normal(size=(args.steps * batch, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    sae = SparseAutoencoder(k=128, aux_k=256, expansion=32, epochs=1, batch_size=batch, device=str(device))
    _peak_reset(device)
    t0 = time.perf_counter()
    sae.fit(x, "smoke")
    s = time.perf_counter() - t0
    sae_out = {"k": 128, "aux_k": 256, "expansion": 32, "batch_size": batch, "samples": len(x),
               "samples_per_s": len(x) / s, "peak_gib": _peak(device)}
    mb = min(MASK_BATCH, len(x))
    t = rng.normal(size=(args.steps * mb, d)).astype(np.float32)
    t /= np.linalg.norm(t, axis=1, keepdims=True)
    xi = x[np.arange(len(t)) % len(x)]
    tevi = TEVI(conditioning="negative", epochs=1, batch_size=mb, device=str(device))
    _peak_reset(device)
    t0 = time.perf_counter()
    tevi.fit(xi, t, sae=sae)
    s = time.perf_counter() - t0
    steps = len(t) // mb
    return sae_out, {"conditioning": "negative", "batch_size": mb, "steps": steps, "steps_per_s": steps / s,
                     "peak_gib": _peak(device)}


def lora(args, enc, device: torch.device) -> dict:
    import copy

    from vlctl.encoders.open_clip_encoder import autocast_for
    from vlctl.methods.threevl.lora import add_lora_peft, lora_parameters
    from vlctl.methods.threevl.tree_tune import contrastive_loss, negclip_loss, tree_loss
    from vlctl.train.config import LoopConfig
    from vlctl.train.loop import train

    captions = ["a man riding a red bike down a busy street", "two dogs playing with a ball on the grass",
                "a plate of food with broccoli and rice", "a woman holding an umbrella in the rain"]
    b = min(THREE_VL_BATCH, args.lora_batch_size)
    levels, cands = 4, 9
    tok = enc.tokenize(captions)
    out = {"rank": 1, "batch_size": b, "tree_levels": levels, "tree_candidates": cands, "precision": args.precision}
    x_all = torch.randn(b, 3, enc.image_size, enc.image_size)
    train_precision = "fp32" if args.precision == "fp16" else args.precision
    for mode in ("contrastive", "negclip", "tree"):
        model = add_lora_peft(copy.deepcopy(enc.model).cpu(), "open_clip", rank=1, alpha=1.0)

        def make_batch(idx, epoch, mode=mode):
            pos = tok[torch.as_tensor(idx) % len(tok)]
            batch = {"x": x_all[: len(idx)], "pos": pos}
            if mode == "negclip":
                batch["neg"], batch["ok"] = pos.roll(1, 0), torch.ones(len(idx), dtype=torch.bool)
            if mode == "tree":
                batch["tree"] = pos[:, None, None, :].expand(-1, levels, cands, -1).reshape(-1, pos.shape[1])
            return batch

        def loss_fn(m, bt, mode=mode):
            n = bt["x"].shape[0]
            extra = bt.get("neg", bt.get("tree", bt["pos"][:0]))
            with autocast_for(device, train_precision):
                img, txt, scale = m(image=bt["x"], text=torch.cat([bt["pos"], extra]))[:3]
            img, txt = img.float(), txt.float()
            c = contrastive_loss(img, txt[:n], scale)
            if mode == "contrastive":
                return c
            if mode == "negclip":
                return negclip_loss(img, txt[:n], txt[n:], bt["ok"], scale)
            emb = txt[n:].reshape(n, levels, cands, -1)
            mask = torch.ones(n, levels, cands, dtype=torch.bool, device=img.device)
            return 0.5 * tree_loss(img, emb, mask, scale) + 0.5 * c

        steps = args.steps
        cfg = LoopConfig(epochs=1, batch_size=b, lr=3e-6, weight_decay=0.1, progress=False, log_every=max(1, steps))
        with tempfile.TemporaryDirectory(prefix="vlctl-gpu-smoke-lora-") as tmp:
            _peak_reset(device)
            r = train(model, n_samples=b * (steps + 1), make_batch=make_batch, loss_fn=loss_fn, cfg=cfg, out_dir=tmp,
                      param_groups=[{"params": list(lora_parameters(model).values()), "lr": 3e-6,
                                     "weight_decay": 0.1}], device=device.type, stop_after_steps=steps)
        out[mode] = {"steps": r.steps, "steps_per_s": r.steps / r.seconds, "peak_gib": _peak(device)}
        del model
    return out


def controlembed(args, device: torch.device, d: int) -> dict:
    from vlctl.methods.controlembed.estimator import ControlEmbed

    rng = np.random.default_rng(0)
    n = 2000
    x = rng.normal(size=(n, d)).astype(np.float32)
    labels = {c: rng.integers(0, 10, n) for c in ("color", "shape", "texture", "count")}
    text = {c: rng.normal(size=(10, d)).astype(np.float32) for c in labels}
    _peak_reset(device)
    t0 = time.perf_counter()
    ControlEmbed(steps=args.steps, device=str(device)).fit(x, labels, encoder_id="smoke", class_text_emb=text)
    s = time.perf_counter() - t0
    return {"d": d, "steps": args.steps, "steps_per_s": args.steps / s, "peak_gib": _peak(device)}


def expected_hours(r: dict) -> dict:
    """Wall time of each paper experiment on this device from the measured rates (compute only;
    reading the dataset from disk can be slower than these rates)."""
    img_s = r["embedding"]["pipeline_images_per_s"]
    txt_s = img_s * 4  # a text costs about a quarter of an image (measured on CPU; see real_common)

    def h(seconds: float) -> float:
        return round(seconds / 3600, 3)

    embed_coco = COCO_TRAIN_IMAGES / img_s + COCO_TRAIN_CAPTIONS / txt_s
    sae = SAE_EPOCHS * COCO_TRAIN_IMAGES / r["sae"]["samples_per_s"]
    mask = MASK_EPOCHS * (COCO_TRAIN_CAPTIONS // MASK_BATCH) / r["tevi"]["steps_per_s"]
    lora_s = sum(THREE_VL_EPOCHS * (COCO_TRAIN_CAPTIONS // THREE_VL_BATCH) / r["lora"][m]["steps_per_s"]
                 for m in ("contrastive", "negclip", "tree"))
    ce = 3 * CONTROLEMBED_STEPS / r["controlembed"]["steps_per_s"]  # ours, translation-only, per-attribute
    return {
        "tevi-coco (COCO train)": h(embed_coco + sae + mask),
        "tevi-coco (CC12M pairs, embedding only)": h(CC12M_PAIRS / img_s + CC12M_PAIRS / txt_s),
        "3vl-coco (three LoRA runs, 12 epochs each)": h(lora_s + embed_coco / 5),
        "controlembed-clevr4": h(CLEVR4_IMAGES / img_s + ce),
        "note": "compute from the measured rates; data loading from disk and evaluation come on top",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--model", default="ViT-B-16", help="OpenCLIP architecture, random weights (default ViT-B-16)")
    p.add_argument("--precision", default=None, choices=("fp32", "bf16", "fp16"),
                   help="autocast precision (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--steps", type=int, default=50, help="timed steps of each training stage (default 50)")
    p.add_argument("--n-images", type=int, default=8192, help="images embedded (default 8192)")
    p.add_argument("--embed-batch-size", type=int, default=512, help="embedding batch size (default 512)")
    p.add_argument("--workers", type=int, default=12, help="JPEG-decoding DataLoader workers (default 12)")
    p.add_argument("--sae-batch-size", type=int, default=SAE_BATCH)
    p.add_argument("--lora-batch-size", type=int, default=THREE_VL_BATCH)
    p.add_argument("--out", default="benchmarks/gpu_smoke.json", help="where to write the JSON")
    args = p.parse_args(argv)
    if args.precision is None:
        args.precision = "bf16" if args.device.startswith("cuda") else "fp32"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_smoke: no CUDA device here; run with --device cpu for the CPU smoke", file=sys.stderr)
        return 2
    device = torch.device(args.device if args.device != "cuda" else "cuda:0")
    t_start = time.perf_counter()
    r: dict = {"device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
               else platform.processor() or platform.machine(), "torch": torch.__version__,
               "args": vars(args)}
    if True:  # one block: the order is the report's
        t0 = time.perf_counter()
        r["embedding"], enc = embedding(args, device)
        print(f"embedding: {r['embedding']['pipeline_images_per_s']:.0f} images/s (files), "
              f"{r['embedding']['forward_images_per_s']:.0f} images/s (forward) in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr, flush=True)
        d = int(enc.embed_dim)
        t0 = time.perf_counter()
        r["sae"], r["tevi"] = sae_and_tevi(args, device, d)
        print(f"sae: {r['sae']['samples_per_s']:.0f} samples/s; tevi mask: {r['tevi']['steps_per_s']:.1f} steps/s "
              f"in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        r["lora"] = lora(args, enc, device)
        print("lora: " + ", ".join(f"{m} {r['lora'][m]['steps_per_s']:.2f} steps/s"
                                   for m in ("contrastive", "negclip", "tree"))
              + f" in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        r["controlembed"] = controlembed(args, device, d)
    peaks = [v.get("peak_gib") for v in (r["sae"], r["tevi"], r["controlembed"], *[r["lora"][m] for m in
             ("contrastive", "negclip", "tree")])] + [r["embedding"]["pipeline_peak_gib"], r["embedding"]["forward_peak_gib"]]
    r["peak_gpu_memory_gib"] = max((p for p in peaks if p is not None), default=None)
    r["expected_hours"] = expected_hours(r)
    r["seconds"] = time.perf_counter() - t_start
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from vlctl.io import atomic_write_json

    atomic_write_json(out, json.loads(json.dumps(r, default=str)))
    print(json.dumps({k: r[k] for k in ("device_name", "peak_gpu_memory_gib", "expected_hours", "seconds")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
