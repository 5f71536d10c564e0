"""A report is a list of blocks (headings, text, tables, figures) rendered to Markdown and HTML.

Recipes build one `Report`; numbers in tables come straight from the results dict that is saved
as results.json beside it, so the report never shows a number that is not in the JSON.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlctl.io import atomic_write_text


def fmt(v: Any, digits: int = 1) -> str:
    """Numbers as the report prints them: floats with `digits` decimals, None as an en dash."""
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


_STYLE = (
    "<style>body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.25em .6em;"
    "text-align:right}th{background:#f3f3f3}td:first-child{text-align:left}img{max-width:100%}"
    "figcaption{color:#555;font-style:italic}</style></head><body>"
)


_CODE = re.compile(r"`([^`]+)`")
_STRONG = re.compile(r"\*\*(.+?)\*\*")
_EM = re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])")


def inline_html(text: str) -> str:
    """Markdown's inline marks of a report's text (`code`, **strong**, *emphasis*) as HTML, the
    rest escaped: report.html showed the Markdown's asterisks and backticks as typed. Code spans
    are taken first, so marks inside them stay literal."""
    parts = _CODE.split(text)  # even: prose, odd: code
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"<code>{html.escape(part)}</code>")
        else:
            part = _STRONG.sub(r"<strong>\1</strong>", html.escape(part))
            out.append(_EM.sub(r"<em>\1</em>", part))
    return "".join(out)


@dataclass
class Report:
    title: str
    blocks: list[tuple[str, Any]] = field(default_factory=list)

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(("heading", (level, text)))

    def text(self, text: str) -> None:
        self.blocks.append(("text", text))

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 1) -> None:
        self.blocks.append(("table", ([str(h) for h in headers], [[fmt(c, digits) for c in r] for r in rows])))

    def timings(self, timings: dict, heading: str = "Timings") -> None:
        """The stage table of a recipe's `results["timings"]`: {stage: {seconds, cached}, total_seconds}."""
        self.heading(heading)
        self.table(["stage", "seconds", "cached"],
                   [[k, v["seconds"], v["cached"]] for k, v in timings.items() if isinstance(v, dict)]
                   + [["total", timings["total_seconds"], ""]])

    def figure(self, path: str, caption: str) -> None:
        """`path` relative to the report's directory (e.g. figures/x.png)."""
        self.blocks.append(("figure", (path, caption)))

    def to_markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for kind, b in self.blocks:
            if kind == "heading":
                out += ["#" * b[0] + " " + b[1], ""]
            elif kind == "text":
                out += [b, ""]
            elif kind == "table":
                headers, rows = b
                out.append("| " + " | ".join(headers) + " |")
                out.append("|" + "|".join("---" for _ in headers) + "|")
                out += ["| " + " | ".join(r) + " |" for r in rows]
                out.append("")
            elif kind == "figure":
                out += [f"![{b[1]}]({b[0]})", "", f"*{b[1]}*", ""]
        return "\n".join(out)

    def to_html(self) -> str:
        e = html.escape
        out = [
            "<!doctype html><html><head><meta charset='utf-8'>",
            f"<title>{e(self.title)}</title>",
            _STYLE,
            f"<h1>{e(self.title)}</h1>",
        ]
        for kind, b in self.blocks:
            if kind == "heading":
                out.append(f"<h{b[0]}>{inline_html(b[1])}</h{b[0]}>")
            elif kind == "text":
                out.append(f"<p>{inline_html(b)}</p>")
            elif kind == "table":
                headers, rows = b
                out.append("<table><tr>" + "".join(f"<th>{inline_html(h)}</th>" for h in headers) + "</tr>")
                out += ["<tr>" + "".join(f"<td>{inline_html(c)}</td>" for c in r) + "</tr>" for r in rows]
                out.append("</table>")
            elif kind == "figure":
                out.append(f"<figure><img src='{e(b[0])}' alt='{e(b[1])}'><figcaption>{inline_html(b[1])}"
                           "</figcaption></figure>")
        out.append("</body></html>")
        return "\n".join(out)

    def write(self, out_dir: str | Path) -> Path:
        out_dir = Path(out_dir)
        atomic_write_text(out_dir / "report.md", self.to_markdown())
        atomic_write_text(out_dir / "report.html", self.to_html())
        return out_dir / "report.md"
