"""How torch's OpenMP wait policy behaves when other processes share the cores.

Runs 300 AdamW steps of a small MLP (Linear 256 -> GELU -> Linear 256, batch 128) in a fresh
process per setting, since OMP_WAIT_POLICY is read when torch loads its OpenMP runtime:

    python benchmarks/threads_under_load.py [--busy N]

`--busy N` starts N spinning processes beside it (the shared machine's case) and stops them at the
end. Prints one JSON line per setting: {"env": ..., "seconds": ...}.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys

STEPS = """
import time, torch
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 256))
x = torch.randn(128, 256)
opt = torch.optim.AdamW(m.parameters())
t = time.perf_counter()
for _ in range(300):
    loss = m(x).square().mean(); opt.zero_grad(); loss.backward(); opt.step()
print(time.perf_counter() - t)
"""
SETTINGS = ({"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "ACTIVE"}, {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"},
            {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"})


def _spin() -> None:
    while True:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", type=int, default=0, help="spinning processes to run beside it")
    args = ap.parse_args()
    busy = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for p in busy:
        p.start()
    try:
        for env in SETTINGS:
            out = subprocess.run([sys.executable, "-c", STEPS], env={**os.environ, **env}, capture_output=True,
                                 text=True, check=True).stdout
            print(json.dumps({"env": env, "busy": args.busy, "seconds": round(float(out), 2)}), flush=True)
    finally:
        for p in busy:
            p.terminate()


if __name__ == "__main__":
    main()
