import argparse
import dataclasses
import subprocess
import sys

import pytest

from vlctl.config import (
    add_config_args,
    config_from_args,
    config_from_dict,
    config_to_dict,
    config_to_flags,
    load_config,
    opt,
)
from vlctl.fsops import VlctlError
from vlctl.io import atomic_dir, atomic_write_json, sha256_json


@dataclasses.dataclass(frozen=True)
class _Cfg:
    n: int = opt(3, "a count")
    lr: float = opt(0.5, "a rate")
    name: str = opt("x", "a name")
    flag: bool = opt(True, "a switch")
    sizes: tuple[int, ...] = opt((1, 2), "a tuple")


def test_flags_round_trip():
    cfg = _Cfg(n=7, lr=0.25, name="y", flag=False, sizes=(4, 5, 6))
    parser = argparse.ArgumentParser()
    add_config_args(parser, _Cfg)
    assert config_from_args(_Cfg, parser.parse_args(config_to_flags(cfg))) == cfg
    assert config_from_args(_Cfg, parser.parse_args([])) == _Cfg()
    assert "a rate" in parser.format_help()


def test_config_from_dict_refuses_unknown_fields(tmp_path):
    assert config_from_dict(_Cfg, config_to_dict(_Cfg(sizes=(9,)))) == _Cfg(sizes=(9,))
    atomic_write_json(tmp_path / "c.json", {"n": 1, "nn": 2})
    with pytest.raises(VlctlError, match=r"c\.json.*nn"):
        load_config(_Cfg, tmp_path / "c.json")


def test_atomic_dir_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "half").write_text("x")
        raise RuntimeError("crash")
    assert not target.exists() and list(tmp_path.iterdir()) == []
    with atomic_dir(target) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        raise RuntimeError("crash")
    assert (target / "a").read_text() == "1"  # the previous version survives a failed rewrite


def test_sha256_json_is_key_order_independent():
    assert sha256_json({"a": 1, "b": [1, 2]}) == sha256_json({"b": [1, 2], "a": 1})
    assert sha256_json({"a": 1}) != sha256_json({"a": 2})


@pytest.mark.parametrize(
    "argv",
    [[], ["data", "mad"], ["train", "clip"], ["embed"], ["reproduce"]],
)
def test_every_subcommand_has_help(argv):
    r = subprocess.run([sys.executable, "-m", "vlctl", *argv, "--help"], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert "usage: vlctl" in r.stdout


def test_cli_error_is_one_line_naming_the_file(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "vlctl", "train", "clip", "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "o")],
        capture_output=True, text=True, check=False,
    )
    assert r.returncode == 2
    assert r.stderr.startswith("vlctl: error:") and "nope" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()
