"""The estimator contract (vlctl.methods.base, vlctl.artifacts) for all four methods: one Config
per estimator whose fields are the CLI flags, keyword construction, fit(source) -> self, save/load
round trips, refusals (another encoder, class, version, unknown keyword), older saved layouts."""

from __future__ import annotations

import argparse
import dataclasses
import json
import types

import numpy as np
import pytest
import torch

from vlctl.artifacts import CONFIG_FILE
from vlctl.cli import methods as cli
from vlctl.encoders import tiny_config, tiny_model
from vlctl.fsops import VlctlError
from vlctl.methods.base import Estimator, UnknownParameterError, embedding_set
from vlctl.methods.controlembed.config import ControlEmbedConfig
from vlctl.methods.controlembed.estimator import AffineHyperNet, ControlEmbed
from vlctl.methods.sae.model import SparseAutoencoder
from vlctl.methods.tevi.estimator import TEVI
from vlctl.methods.threevl.tree_tune import TreeTuner

D = 8
COND = {"color": np.array([1.0, 0.0, 0.0]), "shape": np.array([0.0, 1.0, 0.0])}
VOCAB = ["a", "red", "blue", "circle", "square", "left", "of"]
CAPTIONS = ["a red circle", "a blue square", "a red square", "a blue circle"] * 2


def _emb(n=96, d=D, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    t = (x + 0.3 * rng.normal(size=(n, d))).astype(np.float32)
    labels = {"color": np.arange(n) % 3, "shape": np.arange(n) % 2}
    return x, t, labels


def _tiny():
    return tiny_model.create_model(tiny_config.TinyCLIPConfig(
        name="t", image_size=16, patch_size=4, vision_width=16, vision_layers=1, vision_heads=2, text_width=16,
        text_layers=1, text_heads=2, context_length=8, vocab=VOCAB, embed_dim=8), seed=0)


def _images(n=8):
    return np.random.default_rng(0).integers(0, 255, (n, 16, 16, 3), dtype=np.uint8)


def _fit(name):
    """(fitted estimator, a function of it whose output must survive save/load, fit's return value)."""
    x, t, labels = _emb()
    if name == "sae":
        est = SparseAutoencoder(d_latent=16, k=2, aux_k=4, epochs=2, batch_size=32)
        out = est.fit(x, "enc-a")
        return est, lambda e: e.reconstruct(x), out
    if name == "tevi":
        sae = SparseAutoencoder(d_latent=16, k=2, aux_k=4, epochs=2, batch_size=32).fit(x, "enc-a")
        est = TEVI(hidden=8, epochs=1, batch_size=32)
        out = est.fit(x, t, sae=sae)
        return est, lambda e: e.scores(x[:10], t[:7]), out
    if name == "controlembed":
        est = ControlEmbed(steps=5, hidden=8, images_per_subclass=2, align_weight=0.0)
        out = est.fit(x, labels, encoder_id="enc-a", category_emb=COND)
        return est, lambda e: torch.as_tensor(e.transform(x, "color")), out
    est = TreeTuner(mode="contrastive", epochs=1, batch_size=4, warmup_steps=0, lr=1e-2)
    out = est.fit(_images(), CAPTIONS, model=_tiny())
    x_img = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    return est, lambda e: e.merged_.encode_image(x_img).detach(), out


NAMES = ("sae", "tevi", "controlembed", "tree")
CLASSES = {"sae": SparseAutoencoder, "tevi": TEVI, "controlembed": ControlEmbed, "tree": TreeTuner}


@pytest.fixture(scope="module")
def fitted():
    return {name: _fit(name) for name in NAMES}


# --- one declaration: the Config ----------------------------------------------------------------


@pytest.mark.parametrize("args_fn, cls, extra_exclude", [
    (cli.fit_sae_args, SparseAutoencoder, ("concepts_fixed",)),  # set by --concepts
    (cli.fit_tevi_args, TEVI, ()),
    (cli.fit_controlembed_args, ControlEmbed, ()),
    (cli.fit_tree_args, TreeTuner, ()),
])
def test_every_config_field_is_a_cli_flag(args_fn, cls, extra_exclude):
    p = argparse.ArgumentParser()
    args_fn(p)
    actions = {a.dest: a for a in p._actions}
    for f in dataclasses.fields(cls.Config):
        if f.name in cls.DATA_FIELDS or f.name in extra_exclude:
            assert f.name not in actions, f.name  # set from the data, never a flag
            continue
        assert f.name in actions, f"{cls.__name__}.Config.{f.name} has no --{f.name.replace('_', '-')} flag"
        assert actions[f.name].help.startswith(f.metadata["help"])  # the field's documentation is its help
    # Flags that are not Config fields are the command's own (data paths, outputs), never hyperparameters.
    assert not hasattr(cli, "FitTrainConfig")


@pytest.mark.parametrize("name", NAMES)
def test_construction_from_config_and_keywords(name):
    cls = CLASSES[name]
    assert issubclass(cls, Estimator) and dataclasses.is_dataclass(cls.Config)
    defaults = cls()
    assert defaults.get_params() == {f.name: getattr(cls.Config(), f.name) for f in dataclasses.fields(cls.Config)}
    est = cls(seed=3, lr=0.5)
    assert est.config == dataclasses.replace(cls.Config(), seed=3, lr=0.5)
    assert est.seed == 3 and est.get_params()["lr"] == 0.5  # fields read as attributes
    again = cls(est.config, seed=4)  # a config, keywords override it
    assert again.config == dataclasses.replace(est.config, seed=4) and est.config.seed == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        est.config.seed = 5
    with pytest.raises(UnknownParameterError, match=r"unknown hyperparameter\(s\) \['sedd'\]"):
        cls(sedd=1)
    with pytest.raises(TypeError):  # UnknownParameterError is also a TypeError (and a VlctlError)
        cls(learning_rate=1e-3)
    with pytest.raises(VlctlError, match="config must be a"):
        cls(ControlEmbedConfig() if cls is not ControlEmbed else SparseAutoencoder.Config())
    assert est.set_params(seed=7) is est and est.seed == 7
    assert repr(cls(seed=2)) == f"{cls.__name__}(seed=2)"


@pytest.mark.parametrize("name", NAMES)
def test_fit_returns_self_and_save_load_round_trip(fitted, name, tmp_path):
    est, output, returned = fitted[name]
    cls = CLASSES[name]
    assert returned is est
    assert est.config_ is not None and isinstance(est.encoder_id_, str)
    path = est.save(tmp_path / name)
    doc = json.loads((path / CONFIG_FILE).read_text())
    assert (doc["format"], doc["class"], doc["version"], doc["encoder_id"]) == (
        "vlctl.estimator", cls.__name__, 1, est.encoder_id_)
    back = cls.load(path, encoder_id=est.encoder_id_)
    assert torch.equal(output(back), output(est))
    assert back.config_ == est.config_ and back.encoder_id_ == est.encoder_id_
    assert {k: v for k, v in back.get_params().items() if k not in cls.DATA_FIELDS} == \
        {k: v for k, v in est.config_.__dict__.items() if k not in cls.DATA_FIELDS}
    assert torch.equal(output(cls.load(path)), output(est))  # no encoder check asked


@pytest.mark.parametrize("name", NAMES)
def test_load_refuses_another_encoder(fitted, name, tmp_path):
    est, _, _ = fitted[name]
    path = est.save(tmp_path / name)
    with pytest.raises(VlctlError, match=rf"{CONFIG_FILE}: {CLASSES[name].__name__} was fitted on embeddings of "
                                         rf"encoder '{est.encoder_id_}', not 'other@1'"):
        CLASSES[name].load(path, encoder_id="other@1")


def test_load_refuses_another_class_and_version(fitted, tmp_path):
    path = fitted["controlembed"][0].save(tmp_path / "ce")
    with pytest.raises(VlctlError, match=r"holds a saved ControlEmbed \(made by `vlctl fit controlembed`\), not a "
                       r"SparseAutoencoder \(made by `vlctl fit sae`\)$"):  # issue 43: it said ControlEmbed.load
        SparseAutoencoder.load(path)
    doc = json.loads((path / CONFIG_FILE).read_text())
    (path / CONFIG_FILE).write_text(json.dumps({**doc, "version": 99}))
    with pytest.raises(VlctlError, match=r"format version 99, this vlctl reads version 1; refit with "
                                         "`vlctl fit controlembed`"):
        ControlEmbed.load(path)
    (path / CONFIG_FILE).write_text(json.dumps({**doc, "config": {**doc["config"], "hiddn": 3}}))
    with pytest.raises(VlctlError, match=r"unknown field\(s\) \['hiddn'\]"):
        ControlEmbed.load(path)


def test_tree_tuner_load_rebuilds_the_adapted_model_on_its_base(fitted, tmp_path):
    est, _, _ = fitted["tree"]
    path = est.save(tmp_path / "t")
    (tmp_path / "t" / "run").mkdir()  # the directory also holds `vlctl fit tree`'s run: kept by save
    est.save(path)
    assert (tmp_path / "t" / "run").is_dir() and {"adapters", "model", CONFIG_FILE} <= {p.name for p in path.iterdir()}
    back = TreeTuner.load(path, base=_tiny())
    x, texts = torch.randn(2, 3, 16, 16), ["a red circle", "a blue square"]
    with torch.no_grad():
        for a, b in zip(back.model_(x, texts), est.model_(x, texts)):
            torch.testing.assert_close(a, b)
    with pytest.raises(VlctlError, match="refusing to load them"):
        TreeTuner.load(path, base=tiny_model.create_model(_tiny().config, seed=1))
    with pytest.raises(VlctlError, match="first argument is the data"):
        TreeTuner().fit(_tiny(), CAPTIONS, model=_tiny())


# --- the embeddings source ----------------------------------------------------------------------


def test_fit_takes_a_store_or_arrays(tmp_path):
    from vlctl.embeddings.store import create_store

    x, t, labels = _emb()
    store = create_store(tmp_path / "s", "enc-s", D).add(
        x, texts=t, text_metadata=[{"text": f"caption {i}", "image": i} for i in range(len(x))])
    data = embedding_set(store, paired=True, with_texts=True)
    assert data.encoder_id == "enc-s" and data.image.shape == data.text.shape == (len(x), D)
    assert data.texts[3] == "caption 3"
    kw = {"d_latent": 16, "k": 2, "aux_k": 4, "epochs": 1, "batch_size": 32}
    from_store = SparseAutoencoder(**kw).fit(store)
    from_arrays = SparseAutoencoder(**kw).fit(np.asarray(store.image_emb), encoder_id="enc-s")
    assert from_store.encoder_id_ == "enc-s" and torch.equal(from_store.reconstruct(x), from_arrays.reconstruct(x))
    tevi = TEVI(hidden=8, epochs=1, batch_size=32).fit(store, sae=from_store)
    same = TEVI(hidden=8, epochs=1, batch_size=32).fit(data.image, data.text, sae=from_store)
    assert torch.equal(tevi.scores(x[:5], t[:5]), same.scores(x[:5], t[:5]))
    ce = ControlEmbed(steps=3, hidden=8, images_per_subclass=2, align_weight=0.0).fit(store, labels, category_emb=COND)
    assert ce.encoder_id_ == "enc-s"
    # A duck-typed source: the attributes are the whole contract.
    duck = types.SimpleNamespace(image_emb=x, text_emb=None, texts=None, encoder_id="enc-d")
    assert SparseAutoencoder(**kw).fit(duck).encoder_id_ == "enc-d"
    with pytest.raises(VlctlError, match="needs encoder_id="):
        SparseAutoencoder(**kw).fit(x)
    with pytest.raises(VlctlError, match="come from encoder 'enc-d', not 'enc-x'"):
        SparseAutoencoder(**kw).fit(duck, encoder_id="enc-x")
    with pytest.raises(VlctlError, match="cannot train a mask over an SAE fitted on 'enc-s'"):
        TEVI(epochs=1).fit(x, t, sae=from_store, encoder_id="enc-b")
    with pytest.raises(VlctlError, match="pass the SAE as sae="):
        TEVI(epochs=1).fit(from_store, x)
    with pytest.raises(VlctlError, match="d=4 was given, but the data gives d=8"):
        SparseAutoencoder(d=4, **kw).fit(x, "enc-a")


# --- layouts written before the contract --------------------------------------------------------


def _legacy_sae(path, drop=("lr", "epochs", "batch_size", "warmup_steps", "seed", "device")):
    doc = json.loads((path / CONFIG_FILE).read_text())
    cfg = doc["config"]
    (path / CONFIG_FILE).write_text(json.dumps({
        "config": {k: v for k, v in cfg.items() if k not in drop}, "encoder_id": doc["encoder_id"],
        "fvu": doc["state"]["fvu"], "n_dead": doc["state"]["n_dead"],
        "training": {k: cfg[k] for k in ("lr", "epochs", "batch_size", "seed")}}))


def test_older_layouts_still_load(fitted, tmp_path):
    sae, sae_out, _ = fitted["sae"]
    _legacy_sae(sae.save(tmp_path / "sae"))
    assert torch.equal(sae_out(SparseAutoencoder.load(tmp_path / "sae", encoder_id="enc-a")), sae_out(sae))

    tevi, tevi_out, _ = fitted["tevi"]
    path = tevi.save(tmp_path / "tevi")
    doc = json.loads((path / CONFIG_FILE).read_text())
    training = ("lr", "text_lr", "epochs", "batch_size", "weight_decay", "warmup_steps", "seed", "device")
    (path / "tevi.json").write_text(json.dumps({
        "config": {k: v for k, v in doc["config"].items() if k not in training}, "encoder_id": doc["encoder_id"],
        "training": {k: doc["config"][k] for k in ("lr", "text_lr", "epochs", "batch_size", "seed")},
        "text_encoder_finetuned": False}))
    (path / CONFIG_FILE).unlink()
    _legacy_sae(path / "sae")
    assert torch.equal(tevi_out(TEVI.load(path, encoder_id="enc-a")), tevi_out(tevi))
    with pytest.raises(VlctlError, match=r"tevi.json: TEVI was fitted on embeddings of encoder 'enc-a', not 'b'"):
        TEVI.load(path, encoder_id="b")

    ce, ce_out, _ = fitted["controlembed"]
    path = ce.save(tmp_path / "ce")
    doc = json.loads((path / CONFIG_FILE).read_text())
    arch = ("embed_dim", "cond_dim", "hidden", "parameterisation", "rank")
    (path / CONFIG_FILE).write_text(json.dumps({
        "method": "controlembed", "config": {k: doc["config"][k] for k in arch}, "encoder_id": doc["encoder_id"],
        **{k: doc["state"][k] for k in ("condition_id", "categories", "subclasses", "has_class_text_emb")},
        "training": {k: doc["config"][k] for k in ("temperature", "steps", "lr", "seed")},
        "final_loss": doc["state"]["final_loss"]}))
    back = ControlEmbed.load(path, encoder_id="enc-a")
    assert torch.equal(ce_out(back), ce_out(ce)) and back.config_.head_rank == 0
    with pytest.raises(VlctlError, match="not a saved SparseAutoencoder .*refit with `vlctl fit sae`"):
        SparseAutoencoder.load(path)

    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / CONFIG_FILE).write_text(json.dumps({"what": 1}))
    with pytest.raises(VlctlError, match="refit with `vlctl fit controlembed`"):
        ControlEmbed.load(tmp_path / "junk")


# --- ControlEmbed's factored output layer -------------------------------------------------------


def test_factored_head_is_chosen_for_large_maps_and_starts_at_identity():
    small = ControlEmbedConfig(embed_dim=64, cond_dim=3)  # 256 x 4160 weights: unfactored, as before
    big = ControlEmbedConfig(embed_dim=130, cond_dim=3)  # 256 x 17030 > 2^22: an 8-dim code
    assert (small.code_dim, big.code_dim, dataclasses.replace(big, head_rank=0).code_dim) == (0, 8, 0)
    for param in ("full", "lowrank", "translation"):
        net = AffineHyperNet(dataclasses.replace(big, parameterisation=param, rank=4, head_rank=8))
        assert [type(m).__name__ for m in net.mlp][4:] == ["Linear", "Linear"] and net.mlp[4].bias is None
        w, b = net(torch.randn(2, 3))
        assert torch.equal(w, torch.eye(130).expand(2, 130, 130)) and torch.equal(b, torch.zeros(2, 130))
        (w.sum() + b.sum()).backward()
        assert net.mlp[5].weight.grad.abs().sum() > 0  # P (zero at the start) gets a gradient


def test_factored_head_fits_saves_and_loads(tmp_path):
    x, _, labels = _emb(n=40, d=130)
    model = ControlEmbed(steps=4, images_per_subclass=2, align_weight=0.0).fit(
        x, labels, encoder_id="big", category_emb=COND)
    assert model.config_.head_rank == 8 and model.get_params()["head_rank"] is None  # fit leaves the params alone
    w, _ = model.affine("color")
    assert not np.array_equal(w, np.eye(130, dtype=np.float32))  # it trained
    back = ControlEmbed.load(model.save(tmp_path / "m"), encoder_id="big")
    np.testing.assert_array_equal(back.transform(x, "shape"), model.transform(x, "shape"))
    assert back.get_params()["head_rank"] == 8  # the saved (resolved) config
    again = ControlEmbed(steps=4, images_per_subclass=2, align_weight=0.0).fit(
        x, labels, encoder_id="big", category_emb=COND)
    np.testing.assert_array_equal(again.affine("color")[0], w)  # deterministic
