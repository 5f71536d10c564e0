"""Synthetic datasets in the upstream layouts at the papers' sizes (issue 45), for the scale rehearsal
of the real recipes (benchmarks/rehearsal/run.py). Built by tests/upstream_layouts.py, the same code
as the fixtures of tests/test_recipes_real.py, with the counts scaled by `--scale`.

    nice -n 19 .venv/bin/python benchmarks/rehearsal/make_datasets.py --scale 0.1 --out /work/rehearsal/s0.1

Writes OUT/datasets.json: per dataset its item counts and the seconds its generation took, and per
recipe the `vlctl reproduce` flags that name the datasets. A dataset already generated (its entry
in datasets.json) is kept; delete OUT to regenerate.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import upstream_layouts as layouts

# The papers' sizes (scale 1).
FULL = {
    "coco": {"train": 113_287, "val": 5_000, "test": 5_000},
    "flickr": {"train": 29_000, "val": 1_014, "test": 1_000},
    "cc12m": {"pairs": 1_000_000},
    "docci": {"test": 5_000},
    "iiw": {"test": 400},
    "clevr4": {"train": 5_000, "test": 5_000},
    "stanford40": {"actions": 40, "train_per_action": 100, "test_per_action": 138},  # 4,000 + 5,520 (paper: 9,532)
    "shotbench": {"images": 1_786},  # 3,572 questions, two an image
    "compositional": {"vl_checklist_per_file": 2_000, **{f"sugarcrepe_{k}": v for k, v in
                                                         layouts.SUGARCREPE_SIZES.items()},
                      "aro_relation": 23_937, "aro_attribution": 28_748},
}


def scaled(counts: dict, scale: float) -> dict:
    return {k: v if k == "actions" else max(2, round(v * scale)) for k, v in counts.items()}


def build(name: str, c: dict, out: Path) -> dict:
    """Generate dataset `name` with counts `c` under `out`; its flags (per recipe)."""
    if name == "coco":
        ann = layouts.coco(out / "coco", n_train=c["train"], n_val=c["val"], n_test=c["test"])
        rococo = layouts.rococo(out / "coco", ann)
        coco = ["--coco-root", str(out / "coco"), "--coco-annotations", str(ann)]
        return {"tevi-coco": [*coco, "--rococo-annotations", str(rococo)], "3vl-coco": coco}
    if name == "flickr":
        ann = layouts.flickr(out / "flickr30k", c["train"], c["val"], c["test"])
        return {"tevi-coco": ["--flickr-root", str(out / "flickr30k"), "--flickr-annotations", str(ann)]}
    if name == "cc12m":
        return {"tevi-coco-cc12m": ["--train-shards", layouts.webdataset(out / "cc12m", c["pairs"])]}
    if name in ("docci", "iiw"):
        ann = layouts.long_captions(out / name, c["test"], name.upper())
        return {"tevi-coco": [f"--{name}-root", str(out / name), f"--{name}-annotations", str(ann)]}
    if name == "clevr4":
        return {"controlembed-clevr4": ["--clevr4-root", str(layouts.clevr4(out, c["train"], c["test"]))]}
    if name == "stanford40":
        root, labels = layouts.stanford40(out, c["actions"], c["train_per_action"], c["test_per_action"])
        return {"controlembed-stanford40": ["--stanford40-root", str(root), "--stanford40-labels", str(labels)]}
    if name == "shotbench":
        return {"controlembed-shotbench": ["--shotbench-tsv", str(layouts.shotbench(out, c["images"]))]}
    sc = {k.removeprefix("sugarcrepe_"): v for k, v in c.items() if k.startswith("sugarcrepe_")}
    return {"3vl-coco": layouts.compositional(out / "comp", c["vl_checklist_per_file"], sc, c["aro_relation"],
                                              c["aro_attribution"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the papers' sizes (default 1)")
    ap.add_argument("--out", type=Path, required=True, help="where the datasets go (not the repository)")
    ap.add_argument("--only", nargs="+", choices=sorted(FULL), help="these datasets only")
    ap.add_argument("--cc12m-pairs", type=int, help="CC12M-like pairs instead of 1M x scale")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    record = args.out / "datasets.json"
    doc = json.loads(record.read_text()) if record.is_file() else {"scale": args.scale, "datasets": {}}
    if doc["scale"] != args.scale:
        raise SystemExit(f"{record}: datasets of scale {doc['scale']} are there; use another --out")
    for name in args.only or FULL:
        counts = scaled(FULL[name], args.scale)
        if name == "cc12m" and args.cc12m_pairs:
            counts["pairs"] = args.cc12m_pairs
        if doc["datasets"].get(name, {}).get("counts") == counts:
            continue
        t0, c0 = time.perf_counter(), time.process_time()
        flags = build(name, counts, args.out)
        doc["datasets"][name] = {"counts": counts, "seconds": round(time.perf_counter() - t0, 1),
                                 "cpu_seconds": round(time.process_time() - c0, 1), "flags": flags}
        print(f"{name}: {counts} in {doc['datasets'][name]['seconds']} s", flush=True)
        tmp = record.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(record)


if __name__ == "__main__":
    main()
