"""End to end: the mad-clip recipe on a tiny configuration, and the CLI around it."""

import json
import subprocess
import sys

import numpy as np
import pytest

from vlctl.data.mad import CATEGORIES, VALUES
from vlctl.eval import metrics
from vlctl.eval.metrics import caption_relevance
from vlctl.fsops import VlctlError
from vlctl.recipes.tevi.mad_clip import MadClipRecipe, caption_values, image_values, load_preset, run

TINY = MadClipRecipe(n_train=256, n_test=128, model="mad-quick", epochs=1, batch_size=64, warmup_steps=1, procs=1)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mad-clip")
    run(out, cfg=TINY)
    return out


def test_outputs_and_numbers_recompute_from_arrays(tiny_run):
    r = json.loads((tiny_run / "results.json").read_text())
    assert set(r["zero_shot"]) == set(CATEGORIES)
    z = np.load(tiny_run / "arrays" / "zero_shot.npz")
    assert z["image_emb"].shape == (128, 32)
    for c in CATEGORIES:
        assert z[f"text_{c}"].shape == (len(VALUES[c]), 32) and z[f"label_{c}"].shape == (128,)
        assert metrics.zero_shot_accuracy(z["image_emb"], z[f"text_{c}"], z[f"label_{c}"]) == r["zero_shot"][c]
        assert metrics.zero_shot_accuracy(z["image_emb"], z[f"word_{c}"], z[f"label_{c}"]) == r["zero_shot_word"][c]
    ret = np.load(tiny_run / "arrays" / "retrieval.npz")
    scores = ret["image_emb"] @ ret["text_emb"].T
    assert metrics.recall_at_k(scores, np.arange(128)) == r["retrieval_instance"]
    rel = caption_relevance(ret["image_values"], ret["caption_values"])
    assert metrics.recall_at_k_relevant(scores, rel) == r["retrieval_attribute"]
    for f in ("positive_cosine.png", "zero_shot.png", "samples.png"):
        assert (tiny_run / "figures" / f).stat().st_size > 1000
    md = (tiny_run / "report.md").read_text()
    assert "| thickthinning |" in md and "92.9" in md  # the paper's number beside ours
    assert (tiny_run / "report.html").read_text().count("<table>") >= 3
    assert set(r["timings"]) >= {"data-test", "data-train", "train", "embed", "total_seconds"}


def test_second_run_reuses_every_stage(tiny_run):
    run(tiny_run, cfg=TINY)
    r = json.loads((tiny_run / "results.json").read_text())
    assert all(r["timings"][s]["cached"] for s in ("data-test", "train", "embed"))
    assert "data-train" not in r["timings"]  # the CLIP is trained: its images are not even looked up


def test_caption_relevance_definition():
    labels = [
        {"digit": 3, "color": "red", "thickthinning": "thinning", "swelling": "swelling", "fracture": "fracture",
         "scaling": "large", "caption": "3 - red - swelling - large"},
        {"digit": 3, "color": "blue", "thickthinning": "thinning", "swelling": "swelling", "fracture": "fracture",
         "scaling": "large", "caption": "thinning - 3 - fracture - large"},
    ]
    rel = caption_relevance(image_values(labels), caption_values(labels))
    # image 0 fits caption 1 (which does not name the color); image 1 is blue, not red.
    assert rel.tolist() == [[True, True], [False, True]]


def test_prompt_captions_name_the_value_like_real_captions():
    from vlctl.data.mad import prompt_captions

    for c in CATEGORIES:
        for v in VALUES[c]:
            caps = prompt_captions(c, v, 20)
            for cap in caps:
                parts = cap.split(" - ")
                assert len(parts) == 4 and v in parts
                assert sum(p in VALUES["digit"] for p in parts) == 1
                assert len({cat for cat in CATEGORIES for p in parts if p in VALUES[cat]}) == 4
            assert len(set(caps)) > 5 and caps == prompt_captions(c, v, 20)
    with pytest.raises(VlctlError, match="purple"):
        prompt_captions("color", "purple", 3)


def test_presets_load_and_bad_preset_field_is_refused(tmp_path):
    assert load_preset(quick=True).procs >= 1 and load_preset(quick=False).n_train > load_preset(quick=True).n_train
    from vlctl.config import load_config
    (tmp_path / "r.json").write_text('{"n_train": 5, "epoch": 3}')
    with pytest.raises(VlctlError, match=r"r\.json.*epoch"):
        load_config(MadClipRecipe, tmp_path / "r.json")


def _vlctl(*args):
    return subprocess.run([sys.executable, "-m", "vlctl", *args], capture_output=True, text=True, check=False)


def test_embed_cli_reuses_the_store_and_refuses_other_encoder(tiny_run, tmp_path):
    model = next((tiny_run / "stages").glob("train-*")) / "model"
    test = next((tiny_run / "stages").glob("data-test-*")) / "test"
    train = next((tiny_run / "stages").glob("data-train-*")) / "train"
    store = tmp_path / "store"
    first = _vlctl("embed", str(test), "--encoder", str(model), "--out", str(store), "--json")
    assert first.returncode == 0, first.stderr
    second = _vlctl("embed", str(test), "--encoder", str(model), "--out", str(store), "--json")
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["added"] == a["count"] == a["captions"] > 0 and a["store"] == b["store"]
    assert b["added"] == 0 and b["already_present"] == a["count"]  # nothing embedded twice
    other = _vlctl("embed", str(train), "--encoder", str(model), "--out", str(store))
    assert other.returncode == 2 and "holds other data" in other.stderr
    from vlctl.embeddings.store import open_store

    assert len(open_store(store).texts) == a["count"]
    with pytest.raises(VlctlError, match="encoder"):
        open_store(store, encoder_id="tinyclip-other@0000")


@pytest.mark.slow
def test_recipe_trains_under_torchrun(tmp_path):
    import dataclasses

    run(tmp_path, cfg=dataclasses.replace(TINY, procs=2))
    r = json.loads((tmp_path / "results.json").read_text())
    assert r["encoder_id"].startswith("tinyclip-")


def test_editing_a_config_file_in_place_retrains(tmp_path):
    import dataclasses

    from vlctl.config import config_to_dict
    from vlctl.encoders.tiny_config import get_config

    cfg_file = tmp_path / "my-clip.json"
    arch = config_to_dict(dataclasses.replace(get_config("mad-quick"), vision_layers=1))
    cfg_file.write_text(json.dumps(arch))
    tiny = dataclasses.replace(TINY, model=str(cfg_file))
    run(tmp_path / "out", cfg=tiny)
    arch["vision_width"] = 64  # same file name, other architecture
    cfg_file.write_text(json.dumps(arch))
    run(tmp_path / "out", cfg=tiny)
    r = json.loads((tmp_path / "out" / "results.json").read_text())
    assert r["timings"]["data-train"]["cached"] and not r["timings"]["train"]["cached"]
