"""Embedding extraction inside a real recipe vs the raw forward pass (issue 19's 5% target).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/extract_overhead.py [--model ViT-B-32] [--n 256] [--workers 0 1]

Raw: `model.encode_image` on already preprocessed (n, 3, 224, 224) batches, no_grad, fp32.
Recipe: `vlctl.recipes.real_common.embed_files_and_texts` on the same number of JPEG files (256 px),
i.e. what every real recipe's embed stage runs: the timed probe batch and its estimate line, JPEG
decoding and OpenCLIP's transform (in DataLoader workers when --workers > 0), the forward pass,
the float32 copy out. Both with torch intra-op threads = 1 (the worker, if any, decodes on the
other core). Prints one JSON line per worker count; overhead = recipe / raw - 1.
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="ViT-B-32")
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1])
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(1)
    from PIL import Image

    from vlctl.encoders.factory import create
    from vlctl.recipes.real_common import EncoderRun, embed_files_and_texts

    enc = create(f"open_clip:{args.model}", batch_size=args.batch_size)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i in range(args.n):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
            paths.append(Path(tmp) / f"{i:05d}.jpg")
            paths[-1].write_bytes(buf.getvalue())
        x = torch.stack([enc.preprocess_pil(Image.open(q).convert("RGB")) for q in paths])
        with torch.no_grad():
            enc.model.encode_image(x[: args.batch_size])  # warm-up

        def raw() -> float:
            t0 = time.perf_counter()
            with torch.no_grad():
                for i in range(0, args.n, args.batch_size):
                    enc.model.encode_image(x[i : i + args.batch_size], normalize=True)
            return time.perf_counter() - t0

        raw_s = min(raw() for _ in range(args.repeats))
        for workers in args.workers:
            run = EncoderRun(batch_size=args.batch_size, workers=workers)

            def recipe(run=run) -> float:
                t0 = time.perf_counter()
                embed_files_and_texts(enc, paths, [], run, "benchmark")
                return time.perf_counter() - t0

            recipe_s = min(recipe() for _ in range(args.repeats))
            print(json.dumps({"model": args.model, "n": args.n, "batch_size": args.batch_size, "workers": workers,
                              "raw_forward_s": round(raw_s, 3), "recipe_s": round(recipe_s, 3),
                              "raw_images_per_s": round(args.n / raw_s, 2),
                              "recipe_images_per_s": round(args.n / recipe_s, 2),
                              "overhead": round(recipe_s / raw_s - 1, 4)}), flush=True)


if __name__ == "__main__":
    main()
