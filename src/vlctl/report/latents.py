"""The output of `vlctl inspect sae`: latents.jsonl, a contact sheet per latent, summary.json and
report.md / report.html (issue 46).

    OUT/
      summary.json      the counts, the top names' AUCs and the shuffled-decoder control (the marker)
      latents.jsonl     one row per latent (`vlctl.methods.sae.describe.describe_codes`), with its sheet
      sheets/latent_NNNNN.png   the top images of the `sheets` most frequent live latents
      report.md, report.html    the summary, the table of live latents, the sheets, the dead latents
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from vlctl.io import atomic_dir, atomic_write_json, atomic_write_text
from vlctl.report.writer import Report

FORMAT = "vlctl.inspect-sae/1"
MARKER = "summary.json"
REPORT_ROWS = 1000  # live latents in the report's table (all of them are in latents.jsonl)


def _names(row: dict, n: int = 3) -> str:
    """'red 0.61 (+0.20, AUC 0.99); blue 0.41 ...': a latent's first n names."""
    parts = []
    for nm in row["names"][:n]:
        extra = [] if nm["margin"] is None else [f"+{nm['margin']:.2f}"]
        extra += [] if nm["auc"] is None else [f"AUC {nm['auc']:.2f}"]
        parts.append(f"{nm['name']} {nm['cosine']:.2f}" + (f" ({', '.join(extra)})" if extra else ""))
    return "; ".join(parts)


def _summary_text(s: dict) -> str:
    text = (f"{s['n_latents']} latents over {s['n_images']} images: {s['live']} live, {s['dead']} dead (never fire on "
            f"these images). Names: the nearest of {s['vocabulary']} texts ({s['vocabulary_source']}) to each decoder "
            "row, cosines against the vocabulary's centred text embeddings.")
    top, ctrl = s.get("top_name"), s.get("shuffled_decoder")
    if top and top["checked"]:
        key = next(k for k in top if k.startswith("share_auc_ge_"))
        text += (f" Check: the AUC of each live latent's activation for the images whose caption mentions its top "
                 f"name: mean {top['auc_mean']:.3f}, median {top['auc_median']:.3f}, {100 * top[key]:.0f}% of "
                 f"{top['checked']} at >= {key.rsplit('_', 1)[1]}. Control, names from a shuffled decoder (each live "
                 f"latent named by another's row, seed {ctrl['seed']}): mean {ctrl['auc_mean']:.3f}, "
                 f"{100 * ctrl[key]:.0f}% at >= {key.rsplit('_', 1)[1]}.")
    else:
        text += " No AUC check: the store has no captions."
    return text


def write_inspection(out: str | Path, rows: list[dict], summary: dict, images_of: Callable | None,
                     sheets: int = 64, thumb: int = 64, cols: int = 8, title: str = "SAE latents") -> dict:
    """Write OUT (module docstring) atomically; `images_of(ids)` gives the images of store rows
    for the sheets (None: no sheets). Returns the summary with the output's counts added."""
    from vlctl.report.contact_sheet import write_contact_sheet

    live = sorted((r for r in rows if r["live"]), key=lambda r: (-r["frequency"], r["latent"]))
    width = max(5, len(str(len(rows) - 1)))
    unreadable = 0
    with atomic_dir(out, kind=(MARKER, FORMAT, None)) as tmp:
        rep = Report(title)
        rep.heading("Summary")
        rep.text(_summary_text(summary))
        shown = live[:sheets] if images_of is not None else []
        for r in shown:
            name = f"sheets/latent_{r['latent']:0{width}d}.png"
            head = r["names"][0]["name"] if r["names"] else "?"
            sheet = write_contact_sheet(images_of(r["top_images"]), tmp / name,
                                        f"latent {r['latent']} · {head} · fires on {100 * r['frequency']:.2f}% · "
                                        f"top {len(r['top_images'])}", thumb=thumb, cols=cols,
                                        names=[f"{v:.2f}" for v in r["top_values"]])
            r["sheet"] = name
            unreadable += len(sheet.unreadable)
        rep.heading("Live latents, most frequent first")
        if len(live) > REPORT_ROWS:
            rep.text(f"The {REPORT_ROWS} most frequent of {len(live)}; every latent is in latents.jsonl.")
        rep.table(["latent", "frequency %", "mean activation", "names (cosine, margin, AUC)"],
                  [[r["latent"], 100 * r["frequency"], r["mean_activation"], _names(r)] for r in live[:REPORT_ROWS]],
                  digits=3)
        if shown:
            rep.heading("Top images")
            for r in shown:
                rep.figure(r["sheet"], f"latent {r['latent']}: {_names(r, 1)}")
        elif images_of is None:
            rep.text("No contact sheets: the store names no images (for a store of a generated set, pass --data DIR).")
        dead = [r["latent"] for r in rows if not r["live"]]
        rep.heading("Dead latents")
        rep.text(f"{len(dead)} latents fire on no image of the store" + (f": {', '.join(map(str, dead))}." if dead
                                                                          else "."))
        rep.write(tmp)
        atomic_write_text(tmp / "latents.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        summary = {**summary, "dead_latents": dead, "contact_sheets": len(shown), "unreadable_images": unreadable}
        atomic_write_json(tmp / MARKER, {"format": FORMAT, **summary})  # last: marks a complete output
    return summary
