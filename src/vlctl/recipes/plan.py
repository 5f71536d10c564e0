"""`vlctl reproduce NAME --plan`: what a real recipe's run will cost, printed before anything runs.

The plan lists the recipe's stages, each with its work (data rows times what the config makes of
them: epochs, widths, pairs scored), the time that work takes on this machine's CPU and on one GPU,
its peak memory and disk, and whether a finished stage of that name is in the stage cache.

Nothing is guessed: a stage's time is `fixed + work / rate` and its memory and disk are linear in
its work, each fitted through the stage's two scale-rehearsal runs (benchmarks/rehearsal/, a tenth
and the whole of the papers' sizes, on the tiny random-weight encoder; `rehearsal_rates.json`
beside this module, written by that benchmark). GPU times come from `benchmarks/gpu_smoke.json`
where it exists; without it the column says "not measured". The dataset sizes are read from the
annotation files (and the WebDataset shards' tar headers); no image is decoded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vlctl.recipes.real_common import TEXT_COST

RATES = Path(__file__).with_name("rehearsal_rates.json")
# The plan's last row: a run's time outside its stages (starting Python and torch, reading the annotation
# files, writing the report), measured by the rehearsal as the process's seconds less its stages'.
OUTSIDE = "outside stages"
GPU_SMOKE = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_smoke.json"


def _count_shards(spec: str) -> int:
    """Samples with an image in WebDataset shards, from the tar headers of the first and the last shard:
    img2dataset fills every shard but the last alike (counting all headers of 1M pairs took 33 s of CPU)."""
    import tarfile

    from vlctl.data.loaders.webdataset import expand_shards

    def count(shard: Path) -> int:
        with tarfile.open(shard) as tar:
            return sum(1 for m in tar if m.name.rsplit(".", 1)[-1].lower() in ("jpg", "jpeg", "png", "webp"))

    shards = expand_shards(spec)
    return count(shards[0]) * (len(shards) - 1) + count(shards[-1])


def dataset_counts(recipe: str, data: Any) -> dict[str, Any]:
    """Images and captions of every dataset the recipe reads, from its annotation files."""
    from vlctl.data.loaders import compositional, folder, labelled, retrieval
    from vlctl.recipes.real_data import flag, need_dir, need_file

    out: dict[str, Any] = {}
    if recipe in ("tevi-coco", "3vl-coco"):
        if recipe == "tevi-coco" and data.train_shards:
            n = _count_shards(data.train_shards)
            out["train"] = {"images": n, "captions": n}
        elif recipe == "tevi-coco" and data.train_table:
            d = folder.load_caption_table(need_file(data.train_table, flag("train_table"), "table"))
            out["train"] = {"images": d.n_images, "captions": len(d.captions)}
        # COCO's train split trains unless shards / a table do; its test split is a benchmark when given
        # (3vl-coco needs both): without them, the run's own error
        needed = recipe == "3vl-coco" or not out
        ann = need_file(data.coco_annotations, flag("coco_annotations"), "coco") \
            if data.coco_annotations or needed else None
        for split in ("train", "test") if ann else ():
            if split not in out:
                d = retrieval.load_karpathy(ann, split=split)
                out["train" if split == "train" else "coco"] = {"images": d.n_images, "captions": len(d.captions)}
    if recipe == "tevi-coco":
        if data.flickr_annotations:
            d = retrieval.load_karpathy(need_file(data.flickr_annotations, flag("flickr_annotations"), "flickr"))
            out["flickr"] = {"images": d.n_images, "captions": len(d.captions)}
        for name in ("docci", "iiw"):
            if getattr(data, f"{name}_annotations"):
                d = retrieval.load_long_captions(need_file(getattr(data, f"{name}_annotations"), flag(
                    f"{name}_annotations"), "long"), field=name.upper())
                out[name] = {"images": d.n_images, "captions": len(d.captions)}
        if data.rococo_annotations:
            orig, alt = retrieval.load_rococo(need_file(data.rococo_annotations, flag("rococo_annotations"), "rococo"))
            out["rococo"] = {"images": orig.n_images, "captions": len(orig.captions) + len(alt.captions)}
    elif recipe == "3vl-coco":
        loads = {"vl_checklist": compositional.load_vl_checklist, "sugarcrepe": compositional.load_sugarcrepe,
                 "aro": compositional.load_aro}
        files = [*data.vl_checklist_attribute, *data.vl_checklist_relation, *data.vl_checklist_object]
        out["benchmark_items"] = sum(len(loads[kind](f)[0]) for kind, fs in (
            ("vl_checklist", files), ("sugarcrepe", data.sugarcrepe),
            ("aro", [f for f in (data.aro_relation, data.aro_attribution) if f])) for f in fs)
    elif recipe == "controlembed-clevr4":
        root = need_dir(data.clevr4_root, flag("clevr4_root"), "clevr4")
        splits = [f.get("split") for f in folder.load_clevr4(root, check_images=False).image_fields]
        out["fit"], out["eval"] = splits.count("train"), splits.count("test")
    elif recipe == "controlembed-stanford40":
        root = need_dir(data.stanford40_root, flag("stanford40_root"), "stanford40")
        out["fit"], out["eval"] = (len((root / "ImageSplits" / f"{s}.txt").read_text().split()) for s in ("train", "test"))
    elif recipe == "controlembed-shotbench":
        out["images"] = labelled.load_shotbench(need_file(data.shotbench_tsv, flag("shotbench_tsv"), "shotbench"),
                                                root=data.shotbench_root).n_images
    return out


def _embed(d: dict) -> float:
    return d["images"] + TEXT_COST * d["captions"]


def stage_work(recipe: str, cfg: Any, counts: dict[str, Any]) -> dict[str, float]:
    """Work units of each stage, in run order: the rows a stage goes through times what the config makes
    of them (epochs, SAE width, image x caption pairs scored). Rates are work units per second."""
    if recipe == "tevi-coco":
        tr = counts["train"]
        bench = [b for b in ("coco", "flickr", "docci", "iiw") if b in counts]
        fits = [(k, e) for k in cfg.sweep_k for e in cfg.sweep_expansion]
        work = {"data": tr["images"], "embed-train": _embed(tr),
                **{f"embed-{b}": _embed(counts[b]) for b in [*bench, "rococo"] if b in counts},
                "sae": tr["images"] * (cfg.sae_epochs + 1) * cfg.sae_expansion,
                "tevi": tr["captions"] * cfg.mask_epochs,
                "sae-sweep": tr["images"] * cfg.sweep_epochs * sum(e for _, e in fits)}
        work["evaluate"] = sum(counts[b]["images"] * counts[b]["captions"] for b in [*bench, "rococo"] if b in counts)
        return work
    if recipe == "3vl-coco":
        caps = counts["train"]["captions"]
        caps = min(caps, cfg.max_train_captions) if cfg.max_train_captions else caps
        samples = caps * cfg.epochs  # captions a fine-tune goes through (stop_after_steps: at most its steps' batches)
        samples = min(samples, cfg.stop_after_steps * cfg.batch_size) if cfg.stop_after_steps else samples
        return {"trees": caps, **{f"finetune-{m}": samples for m in ("contrastive", "negclip", "tree")},
                "evaluate": counts["benchmark_items"] + _embed(counts["coco"])}
    if "images" in counts:  # ShotBench: one set, split by eval_fraction (vlctl.recipes.controlembed.real)
        n_eval = max(1, round(cfg.eval_fraction * counts["images"]))
        counts = {"fit": counts["images"] - n_eval, "eval": n_eval}
    return {"data": counts["fit"] + counts["eval"], "embed-fit": counts["fit"], "embed-eval": counts["eval"],
            "fit": cfg.hyper_steps * cfg.images_per_subclass,
            "evaluate": min(cfg.n_queries, counts["eval"]) * counts["eval"]}


def fit_rates(small: dict, big: dict) -> dict[str, dict[str, float]]:
    """Per stage, `value = fixed + per_work * work` through a stage's two rehearsal runs, for its wall
    seconds, peak RSS and bytes written. `small` / `big`: {stage: {"work", "seconds", "peak_rss_bytes",
    "written_bytes"}}. A stage the rehearsal ran with the same work at both sizes (a fit of fixed steps,
    3VL's capped captions) is timed in proportion to its work from the mean of its two runs (their
    difference is the machine's noise; in proportion, a run with more work is not planned at the
    rehearsal's time), with the larger of their memory and disk."""
    out = {}
    for name, b in big.items():
        s = small.get(name)
        if s is None or not b.get("work"):
            continue
        rec = {}
        for field in ("seconds", "peak_rss_bytes", "written_bytes"):
            if b.get(field) is None or s.get(field) is None:
                continue  # not measured (a stage reused from an earlier run records its seconds only)
            vb, vs = b[field], s[field]
            if b["work"] <= s["work"]:
                rec[field] = {"fixed": 0.0, "per_work": (vb + vs) / 2 / b["work"]} if field == "seconds" else \
                    {"fixed": max(vb, vs), "per_work": 0.0}
                continue
            per = max(0.0, (vb - vs) / (b["work"] - s["work"]))
            rec[field] = {"fixed": max(0.0, vb - per * b["work"]), "per_work": per}
        out[name] = rec
    return out


def _gpu_seconds(recipe: str, stage: str, work: float) -> float | None:
    """A stage's time on one GPU from benchmarks/gpu_smoke.json's measured rates; None where not measured."""
    if not GPU_SMOKE.is_file():
        return None
    r = json.loads(GPU_SMOKE.read_text())
    if stage.startswith("embed-") and "embedding" in r:
        return work / r["embedding"]["pipeline_images_per_s"]
    return None


def make_plan(recipe: str, cfg: Any, counts: dict[str, Any], stages: Path, rates_file: Path = RATES,
              shards: bool = False) -> list[dict[str, Any]]:
    """One row per stage: work, expected CPU / GPU seconds, peak memory and disk, cached or not.
    `shards`: tevi-coco trains on WebDataset shards (rates of the rehearsal's `tevi-coco-cc12m`, whose
    data stage unpacks them)."""
    work = stage_work(recipe, cfg, counts)
    rates = json.loads(rates_file.read_text()).get(recipe + ("-cc12m" if shards else ""), {}) \
        if rates_file.is_file() else {}
    rows = []
    for name, w in work.items():
        r = rates.get(name)

        def est(field: str, r=r, w=w) -> float | None:
            return None if r is None or field not in r else r[field]["fixed"] + r[field]["per_work"] * w

        done = [p for p in stages.glob(f"{name}-*") if len(p.name) == len(name) + 13 and (p / "done.json").is_file()]
        rows.append({"stage": name, "work": w, "cpu_seconds": est("seconds"), "gpu_seconds": _gpu_seconds(recipe, name, w),
                     "peak_rss_bytes": est("peak_rss_bytes"), "disk_bytes": est("written_bytes"), "cached": bool(done)})
    if OUTSIDE in rates:
        rows.append({"stage": OUTSIDE, "work": None, "cpu_seconds": rates[OUTSIDE]["seconds"]["fixed"],
                     "gpu_seconds": None, "peak_rss_bytes": None, "disk_bytes": None, "cached": False})
    return rows


def _t(s: float | None) -> str:
    if s is None:
        return "not measured"
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def total_to_run(rows: list[dict[str, Any]]) -> float | None:
    """Expected CPU seconds of the stages not cached; None where one has no measured rate."""
    todo = [r["cpu_seconds"] for r in rows if not r["cached"]]
    return None if None in todo else sum(todo)


def format_plan(recipe: str, counts_line: str, rows: list[dict[str, Any]]) -> str:
    lines = [(f"plan of {recipe} ({counts_line}); times from the scale rehearsal's measured rates "
              "(benchmarks/rehearsal/), with the tiny encoder on this machine alone: a larger encoder adds its forward "
              "to the embed stages, other jobs beside the run slow it"),
             f"  {'stage':<22}{'work':>14}{'CPU':>14}{'one GPU':>14}{'peak RSS':>11}{'disk':>11}  cached"]
    for r in rows:
        gib = "?" if r["peak_rss_bytes"] is None else f"{r['peak_rss_bytes'] / 2**30:.1f} GiB"
        disk = "?" if r["disk_bytes"] is None else f"{r['disk_bytes'] / 2**30:.2f} GiB"
        work = "-" if r["work"] is None else f"{r['work']:,.0f}"
        lines.append(f"  {r['stage']:<22}{work:>14}{_t(r['cpu_seconds']):>14}{_t(r['gpu_seconds']):>14}"
                     f"{gib:>11}{disk:>11}  {'yes' if r['cached'] else 'no'}")
    lines.append(f"  total to run (the stages not cached, and the time outside them): {_t(total_to_run(rows))} on "
                 f"this CPU; peak RSS "
                 f"{max((r['peak_rss_bytes'] or 0) for r in rows) / 2**30:.1f} GiB")
    return "\n".join(lines)


def plan(recipe: str, cfg: Any, data: Any, stages: Path, echo: bool = True) -> dict[str, Any]:
    """The plan: {"counts": the datasets' sizes, "stages": make_plan's rows, "total_cpu_seconds": of the rows
    not cached (`total_to_run`)}; printed as a table on stdout when `echo`."""
    counts = dataset_counts(recipe, data)
    rows = make_plan(recipe, cfg, counts, stages, shards=bool(getattr(data, "train_shards", None)))
    line = ", ".join(f"{k}: {v['images']:,} images, {v['captions']:,} captions" if isinstance(v, dict)
                     else f"{k}: {v:,}" for k, v in counts.items())
    if echo:
        print(format_plan(recipe, line, rows))
    return {"counts": counts, "stages": rows, "total_cpu_seconds": total_to_run(rows)}
