"""The scale rehearsal (issue 45): each real recipe end to end on the synthetic datasets of
make_datasets.py, with a random-weight tiny OpenCLIP (`open_clip:vlctl-tiny-vit`: the forward is
cheap, everything else is what a real run does), at two sizes; per stage its wall time, CPU time,
peak RSS, bytes written and items/s, the longest silence on stderr, and the growth of every stage
from one size to the other. `make bench-scale` (not `make test`).

    nice -n 19 .venv/bin/python benchmarks/rehearsal/run.py --datasets /work/rehearsal/s0.1 \\
        --runs /work/rehearsal/runs --json benchmarks/scale_rehearsal.json [--recipes tevi-coco ...]

Each recipe runs as its own `vlctl reproduce` process, the `--quick` preset with REHEARSAL's
overrides (training epochs kept few: the rehearsal measures how stages grow with the data, not the
models). Runs are added to --json under "<recipe>@<scale>"; "growth" compares the two scales of a
recipe (seconds at the larger / seconds at the smaller, per stage, beside the item ratio: about 10
for linear, at most 12 for n log n).

`--kill STAGE` SIGKILLs the run once STAGE has run `--kill-after` seconds, reruns the same
command, and records whether results.json (its timings aside) equals the uninterrupted run's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))  # this checkout's vlctl, as the runs it starts use
from vlctl.recipes.plan import OUTSIDE  # the plan's row for a run's time outside its stages

ENCODER = "open_clip:vlctl-tiny-vit"
RECIPES = ("controlembed-shotbench", "controlembed-stanford40", "controlembed-clevr4", "tevi-coco", "3vl-coco",
           "tevi-coco-cc12m", "3vl-coco-alltrees")
# Variants of a recipe, rehearsed under their own names:
# tevi-coco-cc12m: tevi-coco trained on the CC12M-like WebDataset shards (COCO test evaluates);
# `vlctl reproduce --plan` reads its rates when --train-shards is given.
# 3vl-coco-alltrees: 3vl-coco over every COCO train caption (trees of all 566k, each fine-tune reading
# all of them), its fine-tunes stopped after 31 steps (about the 2,000 captions of the --quick preset's cap).
VARIANT_OF = {"tevi-coco-cc12m": "tevi-coco", "3vl-coco-alltrees": "3vl-coco"}
# Over each recipe's --quick preset.
REHEARSAL = {
    "tevi-coco": {"sae_epochs": 2, "mask_epochs": 1, "sweep_k": [16], "sweep_expansion": [8], "sweep_epochs": 1},
    # 2,000 training captions at both sizes (the --quick preset's cap): three LoRA fine-tunes over all
    # 566k captions take hours a epoch here. Their cost follows the captions a config takes, not the
    # dataset's size; the benchmarks (77k items at full size) and the COCO test are evaluated whole.
    # 3vl-coco-alltrees takes every caption to its trees and into each fine-tune's data.
    "3vl-coco": {"epochs": 1, "max_train_captions": 2_000},
}
REHEARSAL["tevi-coco-cc12m"] = REHEARSAL["tevi-coco"]
REHEARSAL["3vl-coco-alltrees"] = {"epochs": 1, "max_train_captions": 0, "stop_after_steps": 31}
SCALED: dict[str, tuple[str, ...]] = {}  # fields multiplied by the scale


def work_of(recipe: str, results: dict) -> dict[str, float]:
    """Each stage's work units as `vlctl reproduce --plan` counts them, from the run's config and data
    flags (results.json) and the annotation files they name."""
    import importlib

    from vlctl.config import config_from_dict
    from vlctl.recipes import RECIPES
    from vlctl.recipes.plan import dataset_counts, stage_work
    from vlctl.recipes.real_data import REAL_RECIPES

    recipe = VARIANT_OF.get(recipe, recipe)
    module = importlib.import_module(RECIPES[recipe].split(":")[0])
    cfg = config_from_dict(type(module.load_preset(True)), results["config"])
    data = config_from_dict(REAL_RECIPES[recipe][0], {k: v for k, v in results["data"].items() if v is not None})
    return stage_work(recipe, cfg, dataset_counts(recipe, data))


def flags(recipe: str, datasets: dict) -> list[str]:
    if recipe == "tevi-coco-cc12m":
        return [*datasets["datasets"]["cc12m"]["flags"][recipe], *datasets["datasets"]["coco"]["flags"]["3vl-coco"]]
    return [f for d in datasets["datasets"].values() for f in d["flags"].get(VARIANT_OF.get(recipe, recipe), [])]


def run_once(argv: list[str], log: Path, kill: tuple[str, float] | None = None) -> dict:
    """Run `vlctl reproduce ...` as a child; its exit code, wall and CPU seconds, peak RSS, longest
    gap between stderr lines (and the line after it), and whether it was killed as `kill` asked."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "VLCTL_TERMINAL": "0"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "vlctl", *argv], stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    last, gap, gap_line, lines, killed = time.perf_counter(), 0.0, "", [], [False]
    timer = None

    def killer():
        killed[0] = True
        os.killpg(proc.pid, signal.SIGKILL)

    logf = open(log, "a")  # noqa: SIM115 (closed below, after the child ends)
    for line in proc.stderr:
        logf.write(line)
        logf.flush()
        now = time.perf_counter()
        if now - last > gap:
            gap, gap_line = now - last, line.strip()
        last = now
        lines.append(line)
        if kill and timer is None and f"stage {kill[0]}: started" in line:
            timer = threading.Timer(kill[1], killer)
            timer.start()
    _, status, usage = os.wait4(proc.pid, 0)
    logf.close()
    if timer is not None:
        timer.cancel()
    return {"rc": os.waitstatus_to_exitcode(status), "seconds": round(time.perf_counter() - t0, 1),
            "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1), "peak_rss_bytes": usage.ru_maxrss * 1024,
            "longest_silence_s": round(gap, 1), "line_after_longest_silence": gap_line, "killed": killed[0],
            "resumed": [ln.strip() for ln in lines if "resuming from its checkpoint" in ln or "before the kill" in ln],
            "stderr_tail": "".join(lines[-5:])}


def _plain(results: dict) -> dict:
    """results.json without what differs between equal runs (timings, seconds)."""
    drop = {"timings", "timing", "eval_timings", "seconds", "seconds_exhaustive", "seconds_rerank", "samples_per_s",
            "steps_per_s", "resumed", "fit"}
    if isinstance(results, dict):
        return {k: _plain(v) for k, v in results.items() if k not in drop}
    if isinstance(results, list):
        return [_plain(v) for v in results]
    return results


def record(recipe: str, scale: float, proc: dict, results: dict, out: Path) -> dict:
    """A run's entry: the process figures, and per stage the runner's measurements with its work."""
    work = work_of(recipe, results)
    stages = {}
    for name, t in results["timings"].items():
        if isinstance(t, dict):
            n = work.get(name)
            stages[name] = {**{k: (round(v, 3) if isinstance(v, float) else v) for k, v in t.items()},
                            "work": n, "work_per_s": round(n / t["seconds"], 1) if n and t["seconds"] else None}
    outside = round(proc["seconds"] - sum(t["seconds"] for t in stages.values()), 1) if "seconds" in proc else None
    return {"scale": scale, "process": proc, "stages": stages, "total_seconds": round(results["timings"]["total_seconds"], 1),
            "outside_stages_s": outside,  # starting Python and torch, reading annotations, writing the report
            "disk_bytes": sum(p.stat().st_size for p in out.rglob("*") if p.is_file())}


def predicted(argv: list[str]) -> dict:
    """What `vlctl reproduce ... --plan --json` expects of the run `argv` (read before it starts)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "VLCTL_TERMINAL": "0"}
    cmd = [sys.executable, "-m", "vlctl", *[a for a in argv if a != "--force"], "--plan", "--json"]
    return json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)


def plan_error(planned: dict, entry: dict) -> dict:
    """The plan's CPU-time estimate beside the run: per row [expected, measured] seconds (the rows outside
    the stages against the process's seconds less its stages'), and the whole command's relative error
    (expected / the process's wall seconds - 1; the target is within +-30%). The runs are --force: every
    row counts, cached or not."""
    measured = {**{k: v["seconds"] for k, v in entry["stages"].items()}, OUTSIDE: entry["outside_stages_s"]}
    rows = {r["stage"]: [None if r["cpu_seconds"] is None else round(r["cpu_seconds"], 1),
                         None if measured.get(r["stage"]) is None else round(measured[r["stage"]], 1)]
            for r in planned["stages"]}
    expected = None if any(e is None for e, _ in rows.values()) else sum(e for e, _ in rows.values())
    wall = entry["process"]["seconds"]
    return {"stages": rows, "expected_s": None if expected is None else round(expected, 1), "measured_s": wall,
            "error": None if expected is None else round(expected / wall - 1, 3)}


def command(recipe: str, datasets: dict, runs: Path, resume: bool = False) -> tuple[list[str], Path]:
    """The `vlctl reproduce` arguments of a rehearsal run (its --recipe-config written), and its output folder."""
    scale = datasets["scale"]
    out = runs / f"s{scale}" / recipe
    out.mkdir(parents=True, exist_ok=True)
    cfg = out.parent / f"{recipe}.json"
    over = REHEARSAL.get(recipe, {})
    cfg.write_text(json.dumps({k: round(v * scale) if k in SCALED.get(recipe, ()) else v for k, v in over.items()}))
    return ["reproduce", VARIANT_OF.get(recipe, recipe), "--quick", "--encoder", ENCODER, *flags(recipe, datasets),
            "--out", str(out), "--recipe-config", str(cfg), *([] if resume else ["--force"])], out


def rehearse(recipe: str, datasets: dict, runs: Path, kill: tuple[str, float] | None, resume: bool = False,
             check_plan: bool = False) -> dict:
    scale = datasets["scale"]
    argv, out = command(recipe, datasets, runs, resume)
    print(f"{recipe} @ {scale}: {' '.join(argv)}", flush=True)
    log = out.with_suffix(".log")
    if not resume:
        log.unlink(missing_ok=True)
    planned = predicted(argv) if check_plan else None
    proc = run_once(argv, log)
    if proc["rc"] != 0:
        print(proc["stderr_tail"], flush=True)
        return {"scale": scale, "process": proc}
    results = json.loads((out / "results.json").read_text())
    entry = record(recipe, scale, proc, results, out)
    if planned:
        entry["plan"] = plan_error(planned, entry)
    if kill:
        # The same command, killed in the middle of `kill[0]`, then rerun: it must resume and end equal.
        killed = out.with_name(out.name + "-killed")
        shutil.rmtree(killed, ignore_errors=True)  # the rehearsal's own earlier run
        argv_k = [*argv[:argv.index("--out") + 1], str(killed),
                  *[a for a in argv[argv.index("--out") + 2:] if a != "--force"]]
        first = run_once(argv_k, log, kill)
        second = run_once(argv_k, log)
        same = (second["rc"] == 0 and _plain(json.loads((killed / "results.json").read_text())) == _plain(results))
        entry["kill"] = {"stage": kill[0], "after_s": kill[1], "killed": first["killed"], "rerun_rc": second["rc"],
                         "rerun_seconds": second["seconds"], "same_results": same,
                         "resumed": second["resumed"]}
    return entry


def growth(doc: dict) -> dict:
    """Per recipe, per stage: seconds at the larger scale / seconds at the smaller, and the item ratio."""
    out = {}
    for recipe in RECIPES:
        runs = sorted((v for k, v in doc["runs"].items() if k.startswith(recipe + "@") and "stages" in v),
                      key=lambda v: v["scale"])
        if len(runs) < 2:
            continue
        small, big = runs[0], runs[-1]
        out[recipe] = {"scales": [small["scale"], big["scale"]], "total": round(big["total_seconds"] / max(
            small["total_seconds"], 1e-9), 2)}
        for name, b in big["stages"].items():
            s = small["stages"].get(name)
            if s and s["seconds"] > 0:
                out[recipe][name] = {"time_ratio": round(b["seconds"] / s["seconds"], 2),
                                     "cpu_ratio": round(b["cpu_seconds"] / max(s["cpu_seconds"], 1e-3), 2)
                                     if "cpu_seconds" in b else None,  # a stage reused from a killed run: wall only
                                     "work_ratio": round(b["work"] / s["work"], 2) if b.get("work") and s.get(
                                         "work") else None,
                                     "rss_ratio": round(b["peak_rss_bytes"] / s["peak_rss_bytes"], 2)
                                     if "peak_rss_bytes" in b else None}
    return out


def write_rates(doc: dict, path: Path) -> None:
    """The per-stage rates `vlctl reproduce --plan` reads, fitted through each recipe's two scales."""
    from vlctl.recipes.plan import fit_rates

    rates = {}
    for recipe in RECIPES:
        runs = sorted((v for k, v in doc["runs"].items() if k.startswith(recipe + "@") and "stages" in v),
                      key=lambda v: v["scale"])
        if len(runs) >= 2:
            rates[recipe] = {stage: {f: {k: float(f"{v:.4g}") for k, v in line.items()} for f, line in fits.items()}
                             for stage, fits in fit_rates(runs[0]["stages"], runs[-1]["stages"]).items()}
            outside = [r["outside_stages_s"] for r in (runs[0], runs[-1]) if r.get("outside_stages_s") is not None]
            if outside:  # about the same at every size: their mean
                rates[recipe][OUTSIDE] = {"seconds": {"fixed": round(sum(outside) / len(outside), 1), "per_work": 0.0}}
    path.write_text(json.dumps({"source": "benchmarks/scale_rehearsal.json (benchmarks/rehearsal/run.py)",
                                "machine": doc["machine"], **rates}, indent=1) + "\n")


def markdown(doc: dict) -> str:
    """The findings tables: per recipe and scale its time and peak RSS, then per stage the growth."""
    lines = ["| recipe | scale | wall s | CPU s | peak RSS GiB | longest silence s |", "|---|---|---|---|---|---|"]
    for key, r in sorted(doc["runs"].items()):
        p = r["process"]
        # the stages' peaks: the runner resets the kernel's high-water mark at each stage (clear_refs), which
        # also lowers what the process reports at its exit
        peak = max([p.get("peak_rss_bytes") or 0, *((st.get("peak_rss_bytes") or 0) for st in r.get("stages", {}).values())])
        rss = f"{peak / 2**30:.2f}"
        lines.append(f"| {key.split('@')[0]} | {r['scale']} | {r.get('total_seconds', 'failed')} | "
                     f"{p.get('cpu_seconds', '-')} | {rss} | {p.get('longest_silence_s', '-')} |")
    lines += ["", "| recipe | stage | work ratio | wall ratio | CPU ratio | RSS ratio | wall s (larger) |",
              "|---|---|---|---|---|---|---|"]
    for recipe, g in doc.get("growth", {}).items():
        big = next(v for k, v in doc["runs"].items() if k == f"{recipe}@{g['scales'][1]}")
        for stage, v in g.items():
            if isinstance(v, dict):
                lines.append(f"| {recipe} | {stage} | {v['work_ratio']} | {v['time_ratio']} | {v['cpu_ratio']} | "
                             f"{v['rss_ratio']} | {big['stages'][stage]['seconds']:.1f} |")
    if doc.get("kills"):
        lines += ["", "| run | killed in | after s | resumed | same results.json | rerun s |", "|---|---|---|---|---|---|"]
        lines += [f"| {k} | {v['stage']} | {v['after_s']} | {'; '.join(v['resumed']) or 'finished stages reused'} | "
                  f"{v['same_results']} | {v['rerun_seconds']} |" for k, v in sorted(doc["kills"].items())]
    checked = sorted((k, r["plan"]) for k, r in doc["runs"].items() if r.get("plan"))
    if checked:
        lines += ["", "| run | plan's CPU estimate s | measured s (the whole command) | error |", "|---|---|---|---|"]
        lines += [f"| {k} | {p['expected_s']} | {p['measured_s']} | {p['error']:+.0%} |" for k, p in checked]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", type=Path, nargs="+", required=True,
                    help="make_datasets.py outputs (datasets.json) of one scale, merged")
    ap.add_argument("--runs", type=Path, required=True, help="where the runs go (not the repository)")
    ap.add_argument("--json", type=Path, default=REPO / "benchmarks" / "scale_rehearsal.json")
    ap.add_argument("--recipes", nargs="+", choices=RECIPES, default=list(RECIPES))
    ap.add_argument("--derive", action="store_true", help="run nothing: recount each recorded run's work from its "
                    "results.json under --runs, then the growth and the plan's rates")
    ap.add_argument("--table", action="store_true", help="print the findings tables of --json and stop")
    ap.add_argument("--resume", action="store_true", help="rerun without --force: a killed run goes on from its "
                    "finished stages and checkpoints (those stages' figures are the first run's wall seconds only)")
    ap.add_argument("--check-plan", action="store_true", help="before each run, read what `--plan` expects of it, "
                    "and record the estimate beside the measured times (a scale between the two the rates are "
                    "fitted through tests them independently)")
    ap.add_argument("--kill", metavar="STAGE", help="also kill the run in STAGE and check that it resumes equal")
    ap.add_argument("--kill-after", type=float, default=20.0, help="seconds into STAGE (default 20)")
    args = ap.parse_args()
    if args.table:
        print(markdown(json.loads(args.json.read_text())))
        return
    datasets = {"datasets": {}}
    for d in args.datasets:
        part = json.loads((d / "datasets.json").read_text())
        if datasets.setdefault("scale", part["scale"]) != part["scale"]:
            raise SystemExit(f"{d}: datasets of scale {part['scale']}, not {datasets['scale']}")
        datasets["datasets"].update(part["datasets"])
    doc = json.loads(args.json.read_text()) if args.json.is_file() else {"runs": {}}
    doc["machine"] = f"{os.cpu_count()} CPUs (shared), torch threads {os.environ.get('OMP_NUM_THREADS', 'default')}"
    doc["generation"] = {**doc.get("generation", {}), str(datasets["scale"]): {
        k: {"counts": v["counts"], "seconds": v["seconds"]} for k, v in datasets["datasets"].items()}}
    if args.derive:
        for recipe in RECIPES:  # each run folder of this scale, its process figures kept where recorded
            key, out = f"{recipe}@{datasets['scale']}", args.runs / f"s{datasets['scale']}" / recipe
            if (out / "results.json").is_file():
                proc = doc["runs"].get(key, {}).get("process") or {"note": "process figures not recorded"}
                doc["runs"][key] = {**doc["runs"].get(key, {}), **record(
                    recipe, datasets["scale"], proc, json.loads((out / "results.json").read_text()), out)}
                killed = out.with_name(out.name + "-killed") / "results.json"
                if key in doc.get("kills", {}) and killed.is_file():  # compared again (what _plain leaves out may grow)
                    doc["kills"][key]["same_results"] = _plain(json.loads(killed.read_text())) == _plain(
                        json.loads((out / "results.json").read_text()))
                if args.check_plan:  # the plan of the recorded run, read now from the rates as they stand
                    save(doc, args.json)
                    doc["runs"][key]["plan"] = plan_error(predicted(command(recipe, datasets, args.runs)[0]),
                                                          doc["runs"][key])
        args.recipes = []
    kills = doc.setdefault("kills", {})  # each recipe's kill-and-rerun check, kept when its run is measured again
    for recipe in args.recipes:
        entry = rehearse(recipe, datasets, args.runs, (args.kill, args.kill_after) if args.kill else None, args.resume,
                         args.check_plan)
        if "kill" in entry:
            kills[f"{recipe}@{datasets['scale']}"] = entry.pop("kill")
        doc["runs"][f"{recipe}@{datasets['scale']}"] = entry
        print(json.dumps({k: entry.get(k) for k in ("total_seconds", "disk_bytes")} | {
            "peak_rss_GiB": round(entry["process"]["peak_rss_bytes"] / 2**30, 2),
            "silence_s": entry["process"]["longest_silence_s"]}), flush=True)
        save(doc, args.json)
    save(doc, args.json)


def save(doc: dict, path: Path) -> None:
    doc["growth"] = growth(doc)
    write_rates(doc, REPO / "src" / "vlctl" / "recipes" / "rehearsal_rates.json")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


if __name__ == "__main__":
    main()
