"""The code's citations of docs/methods.md and docs/design.md point at sections that exist.

Comments and docstrings cite the method definitions by section number ("docs/methods.md §1.4")
and the design notes by section title ('docs/design.md, "Cost model to design against"'). This
test reads the headings of both documents and checks every such citation in the repository's
text files (src/, tests/, experiments/, benchmarks/, docs/):

(a) every `§N` or `§N.M` that follows "docs/methods.md" on the same line is the number of a
    heading of docs/methods.md ("## 1. TEVI ...", "### 1.4 What TEVI reports"); section
    numbers of the papers themselves ("§IV-B") are Roman and are not read;
    every `docs/design.md, "Title"` names a heading of docs/design.md;
(b) no file cites a bare METHODS.md or DESIGN.md (the restatement's file names, which are not
    in the repository);
(c) docs/methods.md keeps the section numbering the code relies on.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SCANNED = ("src", "tests", "experiments", "benchmarks", "docs")
SUFFIXES = {".py", ".md", ".json", ".jsonl", ".txt", ".toml", ".yaml", ".yml", ".cfg"}
MAX_BYTES = 2_000_000  # large result files hold numbers, not citations

METHODS_REF = re.compile(r"docs/methods\.md")
SECTION = re.compile(r"§(\d+(?:\.\d+)*)")
DESIGN_REF = re.compile(r'docs/design\.md,\s*"([^"\n]+)"')
# A file name not preceded by a path component or a word character: "METHODS.md", not "docs/methods.md".
BARE = re.compile(r"(?<![\w/.\-])(?:METHODS|DESIGN)\.md")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
NUMBERED = re.compile(r"^(\d+(?:\.\d+)*)\.?\s")

REQUIRED_SECTIONS = ("1", "1.1", "1.2", "1.3", "1.4", "2", "3", "3.1", "3.2", "3.3", "3.4")


def headings(path: Path) -> list[str]:
    """The heading texts of a Markdown file, in order, outside fenced code blocks."""
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            out.append(m.group(2))
    return out


def section_numbers(path: Path) -> set[str]:
    """{"1", "1.1", ...}: the numbers that open the headings of `path`."""
    return {m.group(1) for h in headings(path) if (m := NUMBERED.match(h))}


def section_titles(path: Path) -> set[str]:
    """The heading texts of `path`, with and without a leading section number."""
    out = set()
    for h in headings(path):
        out.add(h)
        out.add(NUMBERED.sub("", h, count=1))
    return out


def text_files() -> list[Path]:
    files = []
    for top in SCANNED:
        for f in sorted((ROOT / top).rglob("*")):
            if (f.is_file() and f.suffix in SUFFIXES and f.stat().st_size <= MAX_BYTES
                    and "__pycache__" not in f.parts and ".egg-info" not in str(f)):
                files.append(f)
    return files


def read(f: Path) -> str:
    return f.read_text(encoding="utf-8", errors="replace")


def methods_citations(text: str) -> list[tuple[int, str]]:
    """[(line number, section number)] of every `§N.M` after "docs/methods.md" on its line."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        m = METHODS_REF.search(line)
        if m:
            out.extend((i, s) for s in SECTION.findall(line[m.end():]))
    return out


def design_citations(text: str) -> list[tuple[int, str]]:
    """[(line number, title)] of every `docs/design.md, "Title"`."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in DESIGN_REF.finditer(text)]


def where(f: Path) -> str:
    return str(f.relative_to(ROOT))


# --- the parsers themselves ------------------------------------------------------------------


def test_parsers_on_examples(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# Title\n\n## 1. TEVI — x\n### 1.4 What TEVI reports\n```\n# 9 not a heading\n```\n"
                   "## Cost model to design against\n", encoding="utf-8")
    assert section_numbers(doc) == {"1", "1.4"}
    assert {"Cost model to design against", "TEVI — x", "1. TEVI — x"} <= section_titles(doc)
    text = ('"""A (docs/methods.md §3.3, §IV-B of the paper).\nB (docs/methods.md §1.1; CG-SAE §1.2)\n'
            'C §2 before the name docs/methods.md\nD (docs/design.md, "Cost model to design against"):\n')
    assert methods_citations(text) == [(1, "3.3"), (2, "1.1"), (2, "1.2")]
    assert design_citations(text) == [(4, "Cost model to design against")]
    assert BARE.search("see METHODS.md §1") and BARE.search('(DESIGN.md, "Scale")')
    assert not BARE.search("see docs/methods.md §1, docs/design.md")


# --- (c) the documents -----------------------------------------------------------------------


def test_methods_keeps_its_section_numbering():
    numbers = section_numbers(DOCS / "methods.md")
    missing = [s for s in REQUIRED_SECTIONS if s not in numbers]
    assert not missing, f"docs/methods.md lacks sections {missing}; code cites them (found {sorted(numbers)})"


def test_design_has_the_cost_model_section():
    assert "Cost model to design against" in section_titles(DOCS / "design.md")


# --- (a) every citation names an existing section --------------------------------------------


@pytest.fixture(scope="module")
def corpus() -> dict[Path, str]:
    """Every scanned text file but this one, whose examples are not citations."""
    me = Path(__file__).resolve()
    return {f: read(f) for f in text_files() if f.resolve() != me}


def test_methods_citations_exist(corpus):
    numbers = section_numbers(DOCS / "methods.md")
    found = [(f, i, s) for f, text in corpus.items() for i, s in methods_citations(text)]
    assert found, "no docs/methods.md citation found: the scan is broken"
    bad = [f"{where(f)}:{i}: docs/methods.md §{s}" for f, i, s in found if s not in numbers]
    assert not bad, "citations of sections docs/methods.md does not have:\n" + "\n".join(bad)


def test_design_citations_exist(corpus):
    titles = section_titles(DOCS / "design.md")
    found = [(f, i, t) for f, text in corpus.items() for i, t in design_citations(text)]
    assert found, "no docs/design.md citation found: the scan is broken"
    bad = [f'{where(f)}:{i}: docs/design.md, "{t}"' for f, i, t in found if t not in titles]
    assert not bad, "citations of sections docs/design.md does not have:\n" + "\n".join(bad)


# --- (b) no bare file names ------------------------------------------------------------------


def test_no_bare_methods_or_design_citation(corpus):
    bad = [f"{where(f)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
           for f, text in corpus.items() for m in BARE.finditer(text)]
    assert not bad, ("cite docs/methods.md or docs/design.md, not the bare names (not in the repository):\n"
                     + "\n".join(bad))


# --- links between the README and docs/ --------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
README_MAX_LINES = 300  # a README that reads in ten minutes; the long results live in docs/


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but hyphens dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")


def link_problems(md: Path) -> list[str]:
    """Every relative link of `md` (outside code blocks) whose file, or whose #anchor in a Markdown
    file, does not exist. Links with a scheme (https:, mailto:) are not followed."""
    out, fenced = [], False
    for i, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        for target in [] if fenced else LINK.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            if not dest.exists():
                out.append(f"{where(md)}:{i}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in {slug(h) for h in headings(dest)}:
                out.append(f"{where(md)}:{i}: {target}: no heading #{anchor} in {where(dest)}")
    return out


def test_slug_and_link_checker(tmp_path, monkeypatch):
    assert slug("Why torch 2.14.1") == "why-torch-2141" and slug("The demo's time") == "the-demos-time"
    assert slug("Recipes on several GPUs") == "recipes-on-several-gpus"
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# Top\n## Two words\n[ok](b.md#end) [bad](b.md#nope) [gone](c.md)\n"
                                   "[self](#two-words) [web](https://x.org/y)\n```\n[code](missing.md)\n```\n")
    (tmp_path / "b.md").write_text("# End\n")
    assert link_problems(tmp_path / "a.md") == ["a.md:3: b.md#nope: no heading #nope in b.md", "a.md:3: c.md: no such file"]


def test_readme_and_docs_links_resolve():
    problems = [p for md in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))] for p in link_problems(md)]
    assert not problems, "\n".join(problems)


def test_readme_reads_in_ten_minutes():
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES}: move detail to docs/)"
