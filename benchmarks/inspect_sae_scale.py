"""Issue 46's scale target: `vlctl inspect sae` on a 100k-row store with a 16k-latent SAE, in at most
2 minutes on 2 cores, a progress line every 30 s, memory bounded by streaming.

The store is synthetic: 100,000 random unit image embeddings (d = 512) with one caption each (three
words of the shipped visual-word list joined by " - ") and random caption embeddings, made with a
random-weight TinyCLIP whose closed word vocabulary is those words (it embeds the vocabulary). The
SAE (16,384 latents, k = 32) is fitted for one epoch on 4096 rows: its codes' content does not
matter here, only their number. The command runs in a child process under /usr/bin/time (wall time,
peak RSS), with --sheets 0 (the store has no images).

    python benchmarks/inspect_sae_scale.py WORK [--out benchmarks/inspect_sae_scale.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

N, D, LATENTS, K = 100_000, 512, 16_384, 32


def build(work: Path) -> tuple[Path, Path]:
    from vlctl.embeddings.store import create_store
    from vlctl.encoders.factory import load_encoder
    from vlctl.encoders.tiny_model import create_model
    from vlctl.encoders.tiny_pretrained import save_pretrained
    from vlctl.methods.sae.describe import VISUAL_WORDS, read_vocabulary
    from vlctl.methods.sae.model import SparseAutoencoder

    words = [w for w in read_vocabulary(VISUAL_WORDS) if " " not in w and "-" not in w]
    save_pretrained(create_model("mad-quick", seed=0, embed_dim=D, vocab=tuple(words)), work / "model")
    encoder = load_encoder(f"tiny:{work / 'model'}")
    rng = np.random.default_rng(0)
    img = rng.normal(size=(N, D)).astype(np.float32)
    txt = rng.normal(size=(N, D)).astype(np.float32)
    caps = [" - ".join(rng.choice(words, 3, replace=False)) for _ in range(N)]
    store = create_store(work / "store", encoder.id, D, encoder_spec=encoder.spec)
    store.add(img, texts=txt, text_metadata=[{"text": c, "image": i} for i, c in enumerate(caps)])
    sae = SparseAutoencoder(d_latent=LATENTS, k=K, epochs=1, batch_size=1024, init_b_pre="mean")
    sae.fit(img[:4096] / np.linalg.norm(img[:4096], axis=1, keepdims=True), encoder.id).save(work / "sae")
    return work / "store", work / "sae"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("work", type=Path)
    p.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    args = p.parse_args(argv)
    store, sae = (args.work / "store", args.work / "sae") if (args.work / "sae").is_dir() else build(args.work)
    cmd = ["/usr/bin/time", "-f", "WALL %e RSS_KB %M", sys.executable, "-m", "vlctl", "inspect", "sae", "--store",
           str(store), "--sae", str(sae), "--out", str(args.work / "inspect"), "--sheets", "0", "--overwrite", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    wall, rss = re.search(r"WALL ([\d.]+) RSS_KB (\d+)", proc.stderr).groups()
    progress = [ln for ln in proc.stderr.splitlines() if ln.startswith("[vlctl]")]
    summary = json.loads(proc.stdout)
    result = {"rows": N, "dim": D, "latents": LATENTS, "k": K, "threads": 2, "wall_seconds": float(wall),
              "peak_rss_mib": round(int(rss) / 1024, 1), "progress_lines": progress,
              "live": summary["live"], "vocabulary": summary["vocabulary"], "command": " ".join(cmd[3:])}
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
