"""The package layout: imports point only down the layers, there is no import cycle, no module is
over 600 lines.

Every module under src/vlctl is parsed with `ast`; every `import x` and `from x import y`
anywhere in it (module level, inside functions, under `if TYPE_CHECKING:`) is an edge, relative
imports resolved against the module's package. `from pkg import name` is an import of the module
`pkg.name` when that module exists, else of `pkg`. Imports by string (importlib.import_module) are
not read.

(a) Layers, lowest first; a module's layer is that of its longest matching prefix (whole dotted
    components: `vlctl.train.loop` is L1, `vlctl.train.clip` L5). A module may import its own
    layer and the layers below it, never above; a module in no layer is reported too.
(b) No cycle in the module import graph. A package `__init__` importing its own submodules
    (re-exporting them) is not a cycle with a submodule importing the package; but a submodule
    importing its package stands for importing everything the package's `__init__` imports, so
    `pkg.a -> pkg -> pkg.b -> pkg.a` is one.
(c) No module over MAX_LINES lines (as `wc -l` counts them) unless LONG_MODULES says why it is one
    concept read top to bottom: the limit flags a module for review, it is not a target to split to.
(d) No re-exports: every `from vlctl.x import name` in the package names the module that defines
    `name` (or a submodule of the package `vlctl.x`), and no module imports a vlctl name it does not
    use. The one exception is the front door, `vlctl/__init__.py`, whose lazy names are the public
    surface.
(e) `vlctl.captions`, the caption language, imports no model: neither torch nor any module of
    `vlctl.encoders`, `vlctl.embeddings` or `vlctl.methods`, and importing it loads no torch.

Each check reports every offence at once: the module, the line, the import and the layers.
"""

from __future__ import annotations

import ast
import itertools
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 600
# Modules over MAX_LINES that stay whole, each with why it is one concept (docs/design.md, "Layout").
LONG_MODULES: dict[str, str] = {}

LAYERS: tuple[tuple[str, ...], ...] = (
    ("vlctl.fsops", "vlctl.io", "vlctl.config", "vlctl.images", "vlctl.artifacts", "vlctl.progress",
     "vlctl.threads"),  # L0
    ("vlctl.train.distributed", "vlctl.train.loop", "vlctl.train.config"),  # L1
    ("vlctl.data",),  # L2
    ("vlctl.captions",),  # L3: the caption language (no model, no torch)
    ("vlctl.encoders",),  # L4
    ("vlctl.embeddings",),  # L5
    ("vlctl.train",),  # L6: the rest of it (train.clip)
    ("vlctl.methods",),  # L7
    ("vlctl.eval",),  # L8
    ("vlctl.report",),  # L9
    ("vlctl.recipes", "vlctl.serve", "vlctl.audit"),  # L10
    ("vlctl.cli",),  # L11, with the package itself (below)
)
TOP = ("vlctl", "vlctl.__main__")  # exact names, in the last layer: vlctl/__init__.py and __main__.py


# --- reading the modules -----------------------------------------------------------------------


def where(f: Path) -> str:
    """A file as the report names it: relative to the repository when it is in it."""
    try:
        return str(f.relative_to(SRC.parent))
    except ValueError:
        return str(f)


def module_files(src: Path = SRC, package: str = "vlctl") -> dict[str, Path]:
    """{dotted module name: file} of every module of `package` under `src`."""
    out = {}
    for f in sorted((src / package).rglob("*.py")):
        parts = list(f.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def is_package(name: str, files: Mapping[str, Path]) -> bool:
    return files[name].name == "__init__.py"


def imports_of(name: str, source: str, files: Mapping[str, Path]) -> list[tuple[int, str, str]]:
    """[(line, imported module, the statement as written)] of the vlctl modules `source` imports."""
    package = name if is_package(name, files) else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source, filename=str(files[name]))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.append((node.lineno, alias.name, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            written = f"from {'.' * node.level}{node.module or ''} import "
            for alias in node.names:
                sub = f"{mod}.{alias.name}"
                out.append((node.lineno, sub if sub in files else mod, written + alias.name))
    return [(line, mod, text) for line, mod, text in out if mod == "vlctl" or mod.startswith("vlctl.")]


def read_graph(files: Mapping[str, Path]) -> dict[str, list[tuple[int, str, str]]]:
    return {name: imports_of(name, f.read_text(encoding="utf-8"), files) for name, f in files.items()}


# --- (a) layers ----------------------------------------------------------------------------------


def layer_of(name: str, layers: Iterable[Iterable[str]] = LAYERS, top: Iterable[str] = TOP) -> int | None:
    """Index of the layer whose prefix is the longest match of `name` (None: in no layer)."""
    layers = list(layers)
    if name in top:
        return len(layers) - 1
    best, best_len = None, -1
    for i, prefixes in enumerate(layers):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    return best


def layer_violations(graph: Mapping[str, list[tuple[int, str, str]]], files: Mapping[str, Path]) -> list[str]:
    out = []
    for name in sorted(graph):
        src_layer = layer_of(name)
        if src_layer is None:
            out.append(f"{where(files[name])}: module {name} is in no layer (add its prefix to LAYERS)")
            continue
        for line, mod, text in graph[name]:
            if mod not in files:
                out.append(f"{where(files[name])}:{line}: {name} (L{src_layer}) `{text}`: no module {mod} in src/vlctl")
                continue
            dst = layer_of(mod)
            if dst is None or dst > src_layer:
                dst_layer = "no layer" if dst is None else f"L{dst}"
                out.append(f"{where(files[name])}:{line}: {name} (L{src_layer}) `{text}` imports {mod} ({dst_layer}): "
                           "upwards")
    return out


# --- (b) cycles ----------------------------------------------------------------------------------


def cycle_graph(graph: Mapping[str, list[tuple[int, str, str]]], files: Mapping[str, Path]) -> dict[str, dict]:
    """{module: {imported module: (line, statement)}} with the package rule of (b) applied: a
    package's edges to its own submodules are dropped, and a submodule's edge to its package
    also goes to every submodule the package imports (other than itself)."""
    def inside(mod: str, pkg: str) -> bool:
        return mod.startswith(pkg + ".")

    out: dict[str, dict] = {}
    for name, edges in graph.items():
        out[name] = {}
        for line, mod, text in edges:
            if mod not in files or mod == name:
                continue
            if is_package(name, files) and inside(mod, name):
                continue  # the package re-exports its own submodule
            out[name].setdefault(mod, (line, text))
            if is_package(mod, files) and inside(name, mod):
                for _, sub, _t in graph[mod]:
                    if sub in files and inside(sub, mod) and sub != name:
                        out[name].setdefault(sub, (line, f"{text} (whose __init__ imports {sub})"))
    return out


def find_cycles(g: Mapping[str, Mapping[str, tuple]]) -> list[list[str]]:
    """One cycle [m0, m1, ..., m0] per strongly connected component with a cycle (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in g.get(v, {}):
                comps.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    cycles = []
    for comp in sorted(comps):
        members, start = set(comp), comp[0]
        # shortest path from start back to start inside the component (BFS)
        prev: dict[str, str] = {}
        frontier, found = [start], None
        while frontier and found is None:
            nxt = []
            for v in frontier:
                for w in sorted(g.get(v, {})):
                    if w not in members:
                        continue
                    if w == start:
                        found = v
                        break
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if found is not None:
                    break
            frontier = nxt
        path, v = [start], found
        while v != start:
            path.append(v)
            v = prev[v]
        path.append(start)
        cycles.append([path[0], *reversed(path[1:-1]), start])
    return cycles


def cycle_violations(graph: Mapping[str, list[tuple[int, str, str]]], files: Mapping[str, Path]) -> list[str]:
    g = cycle_graph(graph, files)
    out = []
    for cycle in find_cycles(g):
        lines = [f"import cycle: {' -> '.join(cycle)}"]
        for a, b in itertools.pairwise(cycle):
            line, text = g[a][b]
            lines.append(f"    {where(files[a])}:{line}: {a} `{text}`")
        out.append("\n".join(lines))
    return out


# --- (c) size ------------------------------------------------------------------------------------


def size_violations(files: Mapping[str, Path], limit: int = MAX_LINES, reviewed: Mapping[str, str] = LONG_MODULES) -> list[str]:
    out = []
    for name, f in sorted(files.items()):
        n = f.read_bytes().count(b"\n")
        if n > limit and name not in reviewed:
            out.append(f"{where(f)}: {name} has {n} lines (limit {limit}): cut it by meaning, or say in "
                       "LONG_MODULES why it is one concept")
    return out


# --- (d) re-exports ------------------------------------------------------------------------------


def _top_level(body: list[ast.stmt]) -> Iterable[ast.stmt]:
    for node in body:
        if isinstance(node, ast.If | ast.Try):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
            for handler in getattr(node, "handlers", []):
                yield from _top_level(handler.body)
            yield from _top_level(getattr(node, "finalbody", []))
        else:
            yield node


def defined_names(tree: ast.Module) -> set[str]:
    """The names a module binds itself at its top level: defs, classes, assignments and imports
    of anything that is not a vlctl name (a vlctl submodule imported whole counts as its own)."""
    out = set()
    for node in _top_level(tree.body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                out.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            out.update(a.asname or a.name.split(".")[0] for a in node.names)
    return out


def reexport_violations(files: Mapping[str, Path]) -> list[str]:
    trees = {name: ast.parse(f.read_text(encoding="utf-8")) for name, f in files.items()}
    vlctl_imported = {}  # module -> names it imports from vlctl modules (not whole submodules)
    for name, tree in trees.items():
        vlctl_imported[name] = {a.asname or a.name for node in _top_level(tree.body) if isinstance(node, ast.ImportFrom)
                                and (node.module or "").startswith("vlctl") for a in node.names
                                if f"{node.module}.{a.name}" not in files}
    out = []
    for name, tree in trees.items():
        if name in TOP:
            continue
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        used |= {w for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                 for w in n.value.replace("[", " ").replace("]", " ").replace("|", " ").split()}  # string annotations
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("vlctl")):
                continue
            for a in node.names:
                if f"{node.module}.{a.name}" in files or node.module in TOP:
                    continue
                if node.module in trees and a.name in vlctl_imported[node.module]:
                    out.append(f"{where(files[name])}:{node.lineno}: `from {node.module} import {a.name}`: "
                               f"{node.module} only re-exports it; import it from where it is defined")
                if node in _top_level(tree.body) and (a.asname or a.name) not in used:
                    out.append(f"{where(files[name])}:{node.lineno}: imports {a.name} from {node.module} and never uses "
                               "it (a re-export)")
    return out


# --- (e) the caption language imports no model ------------------------------------------------------

MODEL_PACKAGES = ("torch", "vlctl.encoders", "vlctl.embeddings", "vlctl.methods")


def captions_violations(graph: Mapping[str, list[tuple[int, str, str]]], files: Mapping[str, Path]) -> list[str]:
    out = []
    for name, f in files.items():
        if not (name == "vlctl.captions" or name.startswith("vlctl.captions.")):
            continue
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for mod in mods:
                if any(mod == p or mod.startswith(p + ".") for p in MODEL_PACKAGES):
                    out.append(f"{where(f)}:{node.lineno}: {name} imports {mod}: the caption language loads no model")
    return out


# --- the test ------------------------------------------------------------------------------------


def test_layout():
    files = module_files()
    assert "vlctl.io" in files and "vlctl.cli" in files, f"no vlctl modules found under {SRC}"
    graph = read_graph(files)
    sections = [
        ("(a) imports that point up the layers (or nowhere)", layer_violations(graph, files)),
        ("(b) import cycles", cycle_violations(graph, files)),
        (f"(c) modules over {MAX_LINES} lines", size_violations(files)),
        ("(d) re-exports", reexport_violations(files)),
        ("(e) the caption language and models", captions_violations(graph, files)),
    ]
    report = [f"{title}: {len(found)}\n" + "\n".join(f"  {v}" for v in found) for title, found in sections if found]
    if report:
        text = "\n\n".join(report)
        print(text)
        pytest.fail("package layout violations:\n\n" + text, pytrace=False)


def test_importing_the_caption_language_loads_no_torch():
    """(e) at run time: every module of vlctl.captions imported in a fresh interpreter, and torch
    is still not loaded."""
    import subprocess

    mods = [name for name in module_files() if name.startswith("vlctl.captions")]
    code = "import sys\n" + "".join(f"import {m}\n" for m in mods) + "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('vlctl.methods')))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert len(mods) >= 10 and r.stdout.strip() == "[]", r.stdout


# --- the checker itself, on made-up packages ------------------------------------------------------


def _fake(tmp_path: Path, modules: Mapping[str, str]) -> dict[str, Path]:
    for rel, text in modules.items():
        f = tmp_path / "vlctl" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return module_files(tmp_path)


def test_checker_reads_every_kind_of_import(tmp_path):
    files = _fake(tmp_path, {
        "__init__.py": "",
        "io.py": "",
        "data/__init__.py": "from .loaders import load\n",
        "data/loaders.py": "def load():\n    from ..io import x\n    import vlctl.data.mad\n",
        "data/mad.py": "from vlctl.data import loaders as ld\nfrom vlctl.io import y\nimport os\n",
    })
    graph = read_graph(files)
    assert [m for _, m, _ in graph["vlctl.data"]] == ["vlctl.data.loaders"]
    assert sorted(m for _, m, _ in graph["vlctl.data.loaders"]) == ["vlctl.data.mad", "vlctl.io"]
    assert sorted(m for _, m, _ in graph["vlctl.data.mad"]) == ["vlctl.data.loaders", "vlctl.io"]
    assert find_cycles(cycle_graph(graph, files)) == [["vlctl.data.loaders", "vlctl.data.mad", "vlctl.data.loaders"]]


def test_checker_layers_and_the_package_rule(tmp_path):
    assert layer_of("vlctl.train.loop") == 1 and layer_of("vlctl.train.clip") == 6 and layer_of("vlctl.train") == 6
    assert layer_of("vlctl.iox") is None and layer_of("vlctl") == len(LAYERS) - 1 and layer_of("vlctl.other") is None
    files = _fake(tmp_path, {
        "__init__.py": "",
        "io.py": "import vlctl.data\n",
        "data/__init__.py": "from vlctl.data.a import f\nfrom vlctl.data.b import g\n",
        "data/a.py": "from vlctl.data import g\n",  # a -> data (-> b)
        "data/b.py": "from vlctl.data.c import h\nfrom vlctl.data import f\n",  # b -> data (-> a): a cycle
        "data/c.py": "h = 1\n",
        "data/d.py": "from vlctl.data import f\n",  # d -> data (-> a, b), and nothing imports d
    })
    graph = read_graph(files)
    want = f"{where(files['vlctl.io'])}:1: vlctl.io (L0) `import vlctl.data` imports vlctl.data (L2): upwards"
    assert layer_violations(graph, files) == [want]
    cycles = find_cycles(cycle_graph(graph, files))
    assert cycles == [["vlctl.data.a", "vlctl.data.b", "vlctl.data.a"]]
    files = _fake(tmp_path, {"data/b.py": "from vlctl.data.c import h\n"})  # only init <-> submodule edges left
    assert find_cycles(cycle_graph(read_graph(files), files)) == []
    assert size_violations(files, limit=1) == [(f"{where(files['vlctl.data'])}: vlctl.data has 2 lines (limit 1): cut it "
                                                "by meaning, or say in LONG_MODULES why it is one concept")]


def test_checker_finds_reexports_and_model_imports(tmp_path):
    files = _fake(tmp_path, {
        "__init__.py": "",
        "io.py": "def f():\n    pass\n",
        "data/__init__.py": "",
        "data/a.py": "from vlctl.io import f\n\ndef g():\n    return f()\n",
        "data/b.py": "from vlctl.io import f\n",  # imports f and never uses it: a re-export
        "data/c.py": "from vlctl.data.a import f\n\nf()\n",  # takes f from a module that re-exports it
        "captions/__init__.py": "",
        "captions/t.py": "import torch\nfrom vlctl.methods import x\n",
    })
    found = reexport_violations(files)
    assert any("data/b.py:1: imports f from vlctl.io and never uses it" in v for v in found), found
    assert any("data/c.py:1: `from vlctl.data.a import f`: vlctl.data.a only re-exports it" in v for v in found), found
    assert not any("data/a.py" in v for v in found), found
    found = captions_violations({}, files)
    assert [v.rsplit(": ", 2)[-2] for v in found] == ["vlctl.captions.t imports torch", "vlctl.captions.t imports vlctl.methods"]
    assert size_violations(files, limit=0, reviewed={n: "why" for n in files if n != "vlctl.io"}) == [
        (f"{where(files['vlctl.io'])}: vlctl.io has 2 lines (limit 0): cut it by meaning, or say in LONG_MODULES why it "
         "is one concept")]
