"""`make bench`: throughput of the foundation's hot paths, printed and saved as JSON.

Numbers are measured, never asserted: run on an idle machine and compare across commits.
    python benchmarks/run.py [--out benchmarks/results.json] [--n-mad 10000]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def bench_mad(n: int, workers: int) -> dict:
    from vlctl.data.mad import MadConfig, generate_mad

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        generate_mad(MadConfig(n=n, seed=0, workers=workers), Path(tmp) / "mad")
        s = time.perf_counter() - t0
    return {"n": n, "workers": workers, "seconds": s, "images_per_s": n / s, "seconds_per_10k": s * 10000 / n}


def bench_tinyclip(config: str, batch: int = 256, steps: int = 5, threads: int = 1) -> dict:
    from vlctl.encoders.tiny_clip import clip_loss, create_model

    torch.set_num_threads(threads)
    model = create_model(config, seed=0)
    cfg = model.config
    x = torch.randn(batch, 3, cfg.image_size, cfg.image_size)
    words = [w for w in cfg.vocab][:4]
    tokens = model.tokenize([" - ".join(words)] * batch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i in range(steps + 1):
        if i == 1:
            t0 = time.perf_counter()
        img, txt, scale = model(x, tokens)
        loss = clip_loss(img, txt, scale)
        opt.zero_grad()
        loss.backward()
        opt.step()
    s = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    return {"config": config, "batch": batch, "threads": threads, "params": n_params, "train_samples_per_s": batch * steps / s}


def bench_recall(n_images: int = 5000, per_image: int = 5, d: int = 64) -> dict:
    from vlctl.eval.metrics import recall_at_k

    rng = np.random.default_rng(0)
    img = rng.standard_normal((n_images, d)).astype(np.float32)
    txt = np.repeat(img, per_image, axis=0) + rng.standard_normal((n_images * per_image, d)).astype(np.float32)
    scores = img @ txt.T
    t0 = time.perf_counter()
    recall_at_k(scores, np.repeat(np.arange(n_images), per_image))
    return {"shape": list(scores.shape), "seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results.json")
    ap.add_argument("--n-mad", type=int, default=10000)
    args = ap.parse_args()
    results = {
        "machine": {"cpus": torch.get_num_threads(), "platform": platform.platform(), "torch": torch.__version__},
        "mad_generation": bench_mad(args.n_mad, workers=2),
        "tinyclip_train": [bench_tinyclip(c) for c in ("mad-quick", "mad-paper")],
        "recall_at_k_5k_x_25k": bench_recall(),
    }
    print(json.dumps(results, indent=2))
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
