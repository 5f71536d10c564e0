"""Every option validated from its config: `opt(...)` declares each field's range, the CLI and the
estimators refuse values outside it naming the field; text files are read as UTF-8 with an error
naming the file and the byte offset (issue 18, parts 7 and 8)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import typing

import numpy as np
import pytest

from vlctl.config import (
    add_config_args,
    check_value,
    config_from_args,
    config_from_dict,
    describe,
    load_config,
    opt,
    shorten,
    template_error,
    validate_config,
)
from vlctl.fsops import VlctlError
from vlctl.io import read_text_utf8

CONFIGS = [
    "vlctl.methods.tevi.estimator:TeviConfig", "vlctl.methods.sae.model:TopKSAEConfig", "vlctl.captions.trees:TreeConfig",
    "vlctl.methods.threevl.tree_tune:TreeTuneConfig", "vlctl.methods.controlembed.estimator:ControlEmbedConfig",
    "vlctl.train.loop:LoopConfig", "vlctl.train.clip:ClipTrainConfig", "vlctl.data.mad:MadConfig",
    "vlctl.data.scenes:ScenesConfig", "vlctl.data.shapes:ShapesConfig", "vlctl.eval.retrieval:RetrievalConfig",
    "vlctl.encoders.tiny_config:TinyCLIPConfig", "vlctl.embeddings.extract:ExtractConfig",
    "vlctl.embeddings.search:IndexConfig", "vlctl.recipes.tevi.mad_clip:MadClipRecipe",
    "vlctl.recipes.tevi.mad:TeviMadRecipe", "vlctl.recipes.threevl.scenes:ThreeVLScenesRecipe",
    "vlctl.recipes.controlembed.shapes:ControlEmbedShapesRecipe", "vlctl.recipes.threevl.lit:ThreeVLLitRecipe",
    "vlctl.recipes.tevi.coco:TeviCocoRecipe", "vlctl.recipes.controlembed.real:ControlEmbedRealRecipe",
    "vlctl.recipes.threevl.coco:ThreeVLCocoRecipe", "vlctl.recipes.real_data:ThreeVLCocoData",
    "vlctl.recipes.real_common:EncoderRun", "vlctl.audit:AuditConfig", "vlctl.serve.config:ServeConfig",
    "vlctl.embeddings.milvus:MilvusConfig",
]


def _cls(spec: str) -> type:
    mod, name = spec.split(":")
    return getattr(importlib.import_module(mod), name)


def test_the_list_of_configs_is_complete():
    """Every dataclass under src/vlctl whose fields are declared with opt() is in CONFIGS."""
    import ast
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "vlctl"
    found = set()
    for f in src.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text("utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(s, ast.AnnAssign) and isinstance(s.value, ast.Call) and getattr(s.value.func, "id", "") == "opt"
                for s in node.body
            ):
                found.add(node.name)
    assert found == {c.split(":")[1] for c in CONFIGS}


@pytest.mark.parametrize("spec", CONFIGS)
def test_every_field_declares_its_range_and_the_defaults_are_in_it(spec):
    cls = _cls(spec)
    validate_config(cls())
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        base = args[0]
        if typing.get_origin(base) is tuple:
            base = typing.get_args(base)[0]
        if base in (int, float):  # a lower and an upper bound (resource fields: no unbounded sizes)
            assert {"ge", "gt"} & set(f.metadata) and {"le", "lt"} & set(f.metadata), f"{cls.__name__}.{f.name}"
            assert describe(f.metadata), f.name


def test_recipe_presets_and_tiny_configs_are_in_range():
    from pathlib import Path

    from vlctl.encoders.tiny_config import CONFIG_DIR, TinyCLIPConfig
    from vlctl.io import read_json

    for f in Path(CONFIG_DIR).glob("*.json"):
        load_config(TinyCLIPConfig, f)
    recipes = Path(__file__).resolve().parents[1] / "src" / "vlctl" / "recipes"
    for name, spec in [("tevi/mad-clip", "tevi.mad_clip:MadClipRecipe"), ("tevi/tevi-mad", "tevi.mad:TeviMadRecipe"),
                       ("threevl/3vl-scenes", "threevl.scenes:ThreeVLScenesRecipe"),
                       ("controlembed/controlembed-shapes", "controlembed.shapes:ControlEmbedShapesRecipe")]:
        doc = read_json(recipes / f"{name}.json")
        for preset in ("quick", "full"):
            config_from_dict(_cls("vlctl.recipes." + spec), doc[preset], source=f"{name}.json")


# --- opt and the checks ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Cfg:
    n: int = opt(3, "a count", ge=1, le=10)
    rate: float = opt(0.5, "a rate", gt=0, lt=1)
    mode: str = opt("a", "a mode", choices=("a", "b"))
    device: str | None = opt("cpu", "a device", check="device")
    pair: tuple[float, float] = opt((0.1, 0.2), "two values", ge=0, le=1)
    sizes: tuple[int, ...] = opt((1, 2), "sizes", ge=1, le=100, min_len=1)
    template: str = opt("a {}", "a template", check="template")
    flag: bool = opt(True, "a switch")


def test_describe_and_check_value_name_the_field():
    meta = {f.name: f.metadata for f in dataclasses.fields(_Cfg)}
    assert describe(meta["n"]) == "in [1, 10]" and describe(meta["rate"]) == "in (0, 1)"
    assert describe(meta["mode"]) == "one of a | b" and "torch device" in describe(meta["device"])
    hints = typing.get_type_hints(_Cfg)
    cases = [
        ("n", 0, "X.n: must be >= 1, got 0 (in [1, 10])"), ("n", 11, "must be <= 10, got 11"),
        ("n", True, "must be an integer"), ("n", 2.0, "must be an integer"), ("n", "3", "must be an integer"),
        ("rate", math.nan, "must be a finite number, got nan"), ("rate", math.inf, "finite"), ("rate", 1, "< 1"),
        ("rate", None, "must be given"), ("mode", "c", "must be one of a, b"), ("mode", "", "must not be empty"),
        ("mode", "\udcff", "UTF-8"), ("device", "gpu", "torch device"), ("pair", (0.5,), "exactly 2 values"),
        ("pair", (0.5, 2), "<= 1"), ("pair", 0.5, "a list"), ("sizes", (), "at least 1"),
        ("sizes", (1, "x"), "integer values"), ("template", "a {} {}", "exactly once"), ("template", "{0}", "'{}'"),
        ("flag", 1, "true or false"),
    ]
    for name, value, want in cases:
        with pytest.raises(VlctlError) as e:
            check_value(f"X.{name}", hints[name], meta[name], value)
        assert want in str(e.value), (name, value, str(e.value))
    assert check_value("X.n", hints["n"], meta["n"], np.int64(4)) == 4 and type(
        check_value("X.n", hints["n"], meta["n"], np.int64(4))) is int
    assert check_value("X.sizes", hints["sizes"], meta["sizes"], [3, 4]) == (3, 4)
    assert check_value("X.device", hints["device"], meta["device"], None) is None
    assert check_value("X.rate", hints["rate"], meta["rate"], 0.25) == 0.25
    assert template_error("a photo of {}.") is None and template_error("{}") is None
    assert template_error("{} {}") and template_error("{:>3}") and template_error("{!r}") and template_error("{")


def test_flags_refuse_out_of_range_values_while_parsing(capsys):
    parser = argparse.ArgumentParser(prog="t")
    add_config_args(parser, _Cfg)
    assert config_from_args(_Cfg, parser.parse_args([])) == _Cfg()
    ok = parser.parse_args(["--n", "4", "--pair", "0", "1", "--sizes", "5", "--mode", "b", "--no-flag"])
    assert config_from_args(_Cfg, ok) == _Cfg(n=4, pair=(0.0, 1.0), sizes=(5,), mode="b", flag=False)
    for argv, want in [(["--n", "0"], "argument --n: must be >= 1, got 0 (in [1, 10])"),
                       (["--rate", "nan"], "must be a finite number"), (["--pair", "0.5"], "expected 2 arguments"),
                       (["--mode", "c"], "must be one of a, b"), (["--n", "x"], "must be an integer, got 'x'"),
                       (["--template", "{} {}"], "exactly once")]:
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
        assert want in capsys.readouterr().err, argv
    help_ = parser.format_help()
    assert "(default: 3; in [1, 10])" in help_ and "{a,b}" in help_
    # config_from_args checks values set some other way too, naming the flag
    with pytest.raises(VlctlError, match=r"--n must be <= 10, got 50"):
        config_from_args(_Cfg, argparse.Namespace(n=50))


def test_config_from_dict_refuses_wrong_types_and_ranges_naming_the_file(tmp_path):
    from vlctl.train.config import LoopConfig

    for doc, want in [({"lr": -1}, "LoopConfig.lr: must be > 0, got -1"), ({"epochs": "3"}, "epochs: must be an integer"),
                      ({"betas": [0.9]}, "betas: must have exactly 2 values"), ({"min_lr_ratio": 2}, "<= 1"),
                      ({"grad_clip": None}, "must be given")]:
        (tmp_path / "c.json").write_text(json.dumps(doc))
        with pytest.raises(VlctlError) as e:
            load_config(LoopConfig, tmp_path / "c.json")
        assert want in str(e.value) and "c.json" in str(e.value), str(e.value)
    (tmp_path / "ok.json").write_text(json.dumps({"betas": [0.8, 0.9], "lr": 1}))
    assert load_config(LoopConfig, tmp_path / "ok.json").betas == (0.8, 0.9)
    with pytest.raises(VlctlError, match="expected a JSON object"):
        config_from_dict(LoopConfig, [1, 2], source="x")


def test_estimators_refuse_values_out_of_range():
    from vlctl.methods.controlembed.estimator import ControlEmbed
    from vlctl.methods.sae.model import SparseAutoencoder
    from vlctl.methods.tevi.estimator import TEVI
    from vlctl.methods.threevl.tree_tune import TreeTuner

    for make, want in [
        (lambda: TEVI(lr=-1), "TeviConfig.lr: must be > 0, got -1"),
        (lambda: TEVI(TEVI.Config(lr=math.nan)), "TeviConfig.lr: must be a finite number"),
        (lambda: TEVI(epochs=0), "TeviConfig.epochs: must be >= 1"),
        (lambda: TEVI(device="gpu"), "TeviConfig.device: must be a torch device"),
        (lambda: SparseAutoencoder(batch_size=0), "TopKSAEConfig.batch_size: must be >= 1"),
        (lambda: SparseAutoencoder(k="8"), "TopKSAEConfig.k: must be an integer"),
        (lambda: SparseAutoencoder(warmup_steps=-10), "warmup_steps: must be >= 0"),
        (lambda: ControlEmbed(steps=0), "steps: must be >= 1"),
        (lambda: ControlEmbed(temperature=math.inf), "temperature: must be a finite number"),
        (lambda: ControlEmbed().set_params(lr=-1e-3), "ControlEmbedConfig.lr: must be > 0"),
        (lambda: TreeTuner(mode="trees"), "TreeTuneConfig.mode: must be one of contrastive, negclip, tree"),
        (lambda: TreeTuner(patch_dropout=1.5), "patch_dropout: must be <= 1"),
    ]:
        with pytest.raises(VlctlError) as e:
            make()
        assert want in str(e.value), str(e.value)
    assert TEVI(lr=np.float32(1e-3)).lr == pytest.approx(1e-3)


def test_controlembed_lowrank_rank_is_at_most_the_embedding_dimension():
    from vlctl.methods.controlembed.estimator import ControlEmbed

    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 8)).astype(np.float32)
    labels = {"color": ["red", "blue"] * 8}
    with pytest.raises(VlctlError, match=r"rank: must be <= embed_dim \(8"):
        ControlEmbed(parameterisation="lowrank", rank=9, steps=1).fit(x, labels, encoder_id="e",
                                                                       category_emb={"color": np.ones(4)})


def test_embedding_errors_name_the_store():
    from vlctl.methods.base import embedding_set

    class FakeStore:
        path = "/data/my-store"
        encoder_id = "enc@0"
        image_emb = np.array([[1.0, 0.0], [np.nan, 1.0]], np.float32)

    with pytest.raises(VlctlError, match=r"/data/my-store: image embeddings contain NaN or Inf in 1 row"):
        embedding_set(FakeStore())


# --- UTF-8 text files ----------------------------------------------------------------------------


def test_read_text_utf8_names_the_file_and_the_byte(tmp_path):
    (tmp_path / "ok.txt").write_bytes("\ufeffcafé\n".encode())
    assert read_text_utf8(tmp_path / "ok.txt") == "café\n"  # the byte-order mark dropped
    (tmp_path / "bad.txt").write_bytes(b"abc\n\xe9t\xe9\n")
    with pytest.raises(VlctlError, match=r"bad\.txt: not UTF-8 at byte 4 \(0xe9\) of the labels file"):
        read_text_utf8(tmp_path / "bad.txt", "labels file")
    with pytest.raises(VlctlError, match="nope.txt: captions file not found"):
        read_text_utf8(tmp_path / "nope.txt", "captions file")
    with pytest.raises(VlctlError, match="is a directory"):
        read_text_utf8(tmp_path, "captions file")


def test_annotation_tables_are_utf8_with_the_offset(tmp_path):
    from vlctl.data.loaders.common import _read_table

    (tmp_path / "labels.jsonl").write_bytes(b'{"image": "a.png", "color": "red"}\n{"image": "b\xff.png"}\n')
    with pytest.raises(VlctlError, match=r"labels\.jsonl: not UTF-8 at byte 47 \(0xff\)"):
        _read_table(tmp_path / "labels.jsonl")
    (tmp_path / "a.csv").write_bytes(b"filepath,caption\na.png,caf\xe9\n")
    with pytest.raises(VlctlError, match=r"a\.csv: not UTF-8 at byte 26 \(0xe9\)"):
        _read_table(tmp_path / "a.csv")
    (tmp_path / "nul.csv").write_bytes(b"filepath,caption\na.png,x\x00y\n")
    try:
        _read_table(tmp_path / "nul.csv")  # csv may read a NUL; if it refuses, a VlctlError names the file
    except VlctlError as e:
        assert "nul.csv" in str(e)
    (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbffilepath,caption\na.png,x\n")
    assert _read_table(tmp_path / "bom.csv")[0] == ["filepath", "caption"]


def test_generated_set_labels_are_utf8_with_the_offset(tmp_path):
    from vlctl.data.imageset import read_labels

    (tmp_path / "labels.jsonl").write_bytes(b'{"a": 1}\n{"a": "\xff"}\n')
    with pytest.raises(VlctlError, match=r"labels\.jsonl: not UTF-8 at byte 16 \(0xff\)"):
        read_labels(tmp_path / "labels.jsonl", lambda label, where: None)
    (tmp_path / "ok.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    assert read_labels(tmp_path / "ok.jsonl", lambda label, where: None) == [{"a": 1}, {"a": 2}]


def test_shorten():
    assert shorten("abc") == "abc"
    long = "w " * 5000
    assert shorten(long).endswith("... (10000 characters)") and len(shorten(long)) < 240
