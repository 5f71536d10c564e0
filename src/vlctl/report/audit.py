"""The report of `vlctl audit` (`vlctl.audit.run_audit`), built from its summary.json alone, so
every number it shows is one the summary holds."""

from __future__ import annotations

from pathlib import Path

from vlctl.report.writer import Report


def _ci(row) -> str:
    return f"{row[2]:.1f} [{row[3]:.1f}, {row[4]:.1f}]"


def audit_report(s: dict) -> Report:
    """The report of `vlctl audit`'s summary (`vlctl.audit.run_audit`): what was audited and skipped,
    accuracy overall and per breakdown, the worst items with their maps, the repair's verdict."""
    rep = Report(f"vlctl audit: {Path(s['pairs']).name}")
    rep.text(f"Encoder `{s['encoder']}` on {s['captions']} captions of {s['images']} images "
             f"({s['items']} positive/negative items from 3VL caption trees). An item is correct when the image is "
             "closer to the level's positive than to its one-word negative; intervals are bootstrap 95% over "
             f"captions ({s['config']['n_boot']} resamples). Chance is 50%.")
    if s.get("failed"):
        rep.text(f"{s['failed']} unreadable files were skipped (listed with their reasons in summary.json): "
                 + ", ".join(Path(p).name for p, _ in s["failures"][:10]) + ("..." if s["failed"] > 10 else "") + ".")
    if s["missing_images"]:
        rep.text(f"**{s['missing_images']} images were not found** under {s['looked_in']} and were not audited "
                 f"(first: {', '.join(s['missing_examples'][:5])}).")
    else:
        rep.text(f"Every image was found (looked in {s['looked_in']}).")
    if s["refused_captions"]:
        rep.text(f"{s['refused_captions']} captions were refused by the tree generator (empty, not English or too "
                 "long) and give no items.")
    acc, (lo, hi) = s["accuracy"], s["accuracy_ci95"]
    rep.heading("Overall")
    rep.table(["items", "accuracy % [95% CI]"], [[s["items"], f"{acc:.1f} [{lo:.1f}, {hi:.1f}]"]])
    titles = {"pos": "By part of speech of the replaced word", "depth": "By tree level (1 = coarsest)",
              "stage": "By replacement source", "word": "Most frequent replaced words",
              "category": "By 3vl-scenes checklist category of the replaced word",
              "category_caption": "By checklist category, the caption level only (what the checklist measures)"}
    for key, title in titles.items():
        if key not in s["groups"]:
            continue
        rep.heading(title)
        rep.table([key, "items", "accuracy % [95% CI]"], [[r[0], r[1], _ci(r)] for r in s["groups"][key]])
    if s["worst"]:
        rep.heading("Worst items")
        rep.text("Largest cos(image, negative) - cos(image, positive). Maps: HilaCAM of the positive, the Anchor "
                 "map (text 'AP or AN') and DiRe (red: more relevant to P, blue: to N).")
        rep.table(["#", "image", "caption", "positive", "negative", "cos P", "cos N"],
                  [[w["rank"], w["image"], w["caption"], w["positive"], w["negative"], f"{w['s_pos']:.3f}",
                    f"{w['s_neg']:.3f}"] for w in s["worst"]], digits=3)
        for w in s["worst"]:
            for name in ("hilacam_positive", "anchor", "dire", "image"):
                if name in w.get("maps", {}):
                    rep.figure(w["maps"][name], f"#{w['rank']} {name}: {w['positive']} / {w['negative']}")
    r = s.get("repair")
    if r:
        rep.heading("Repair (tree-loss LoRA) on the held-out part")
        rep.text(f"Fine-tuned on {r['repair_captions']} captions of {r['repair_images']} images ({r['steps']} steps, "
                 f"{r['fit_seconds']} s); audited and retrieved on the {r['held_out_captions']} held-out captions. "
                 f"The adapter is **{r['verdict']}** (refused when an R@1 drops by more than {r['max_drop']} points).")
        b, a = r["accuracy_before"], r["accuracy_after"]
        rep.table(["", "audit accuracy % [95% CI]", "i2t R@1", "t2i R@1"],
                  [["before", f"{b[0]:.1f} [{b[1]:.1f}, {b[2]:.1f}]", r["r1_before"]["i2t@1"], r["r1_before"]["t2i@1"]],
                   ["after", f"{a[0]:.1f} [{a[1]:.1f}, {a[2]:.1f}]", r["r1_after"]["i2t@1"], r["r1_after"]["t2i@1"]]])
    rep.text("Numbers are recomputable from items.jsonl and arrays.npz beside this report.")
    return rep
