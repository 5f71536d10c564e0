"""The README's Python example, run as written on a TinyCLIP after its two setup commands."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np

from vlctl.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def _block(tag: str, lang: str) -> str:
    text = README.read_text("utf-8")
    found = re.search(rf"<!-- {tag} -->\n```{lang}\n(.*?)```\n<!-- /{tag} -->", text, re.DOTALL)
    assert found, f"README.md: the {tag} block is missing"
    return found.group(1)


def test_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    import skimage.data
    from PIL import Image

    monkeypatch.chdir(tmp_path)  # nothing else is made here: the README's own commands make what it uses
    Image.fromarray(skimage.data.chelsea()).save("photo.png")  # 451 x 300: not the model's size
    for line in _block("python-setup", "bash").splitlines():
        argv = shlex.split(line)
        assert argv[0] == "vlctl" and main(argv[1:]) == 0, capsys.readouterr().err
    code = _block("python", "python")
    assert len([ln for ln in code.splitlines() if ln.strip()]) <= 11  # import + ten lines
    scope: dict = {}
    exec(compile(code, "README.md:python", "exec"), scope)  # noqa: S102 -- the README block is the test subject

    store, enc = scope["store"], scope["enc"]
    assert scope["q"].shape == (1, enc.embed_dim) and scope["q"].dtype == np.float32
    assert scope["x"].shape == (1, enc.embed_dim)
    np.testing.assert_allclose(np.linalg.norm(scope["x"], axis=1), 1, rtol=1e-5)
    assert len(store) == 256 and len(store.texts) == 256
    assert len(scope["hits"]) == 5 and all({"digit", "color", "score"} <= set(h) for h in scope["hits"])
    assert scope["scores"].shape == (256, 1)
    assert scope["sae"].encoder_id_ == scope["tevi"].encoder_id_ == scope["ce"].encoder_id_ == enc.id
