"""Tests for vlctl.embeddings.cache with a small real encoder (random-initialised torch modules)."""

from __future__ import annotations

import json
import os
from collections import Counter

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from vlctl.embeddings.cache import EmbeddingCache, cache_key, embed, open_cache
from vlctl.encoders.base import Encoder
from vlctl.fsops import VlctlError
from vlctl.io import sha256_json

SIZE = 4  # images are SIZE x SIZE x 3
CONTEXT = 12  # longest text the tokenizer accepts


class TinyEncoder(torch.nn.Module):
    """A real, if tiny, Encoder: a linear map of the flattened image and a bag-of-characters
    text embedding, both random-initialised from `seed`. Counts its calls."""

    def __init__(self, seed: int = 0, dim: int = 8, fail_after: int | None = None):
        super().__init__()
        torch.manual_seed(seed)
        self.image_proj = torch.nn.Linear(3 * SIZE * SIZE, dim)
        self.char_emb = torch.nn.Embedding(128, dim)
        self.id = f"tiny-linear@seed{seed}"
        self.embed_dim = dim
        self.fail_after = fail_after  # raise on the call after this many encode_images calls
        self.calls: Counter = Counter()

    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        self.calls["preprocess"] += 1
        return torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).float() / 255.0

    def tokenize(self, texts):
        self.calls["tokenize"] += 1
        out = torch.zeros(len(texts), CONTEXT, dtype=torch.long)
        for i, t in enumerate(texts):
            codes = [min(ord(c), 127) for c in t]
            if len(codes) > CONTEXT:
                raise VlctlError(f"text {t!r}: {len(codes)} tokens exceed the context length {CONTEXT}")
            out[i, : len(codes)] = torch.tensor(codes, dtype=torch.long)
        return out

    def encode_images(self, images: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        if self.fail_after is not None and self.calls["encode_images"] >= self.fail_after:
            raise RuntimeError("simulated crash while embedding images")
        self.calls["encode_images"] += 1
        emb = self.image_proj(images.flatten(1))
        return torch.nn.functional.normalize(emb, dim=-1) if normalize else emb

    def encode_texts(self, tokens: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        self.calls["encode_texts"] += 1
        emb = (self.char_emb(tokens) * (tokens > 0).unsqueeze(-1)).sum(1)
        return torch.nn.functional.normalize(emb, dim=-1) if normalize else emb

    def vision_attentions(self, images):
        return self.encode_images(images), []


class BatchedTinyEncoder(TinyEncoder):
    """The same encoder with a batched preprocessing path."""

    def preprocess_batch(self, images: np.ndarray) -> torch.Tensor:
        self.calls["preprocess_batch"] += 1
        return torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float() / 255.0


class RecordingArray:
    """Array-like over a memmap that records each read and refuses to be loaded whole."""

    def __init__(self, arr):
        self.arr, self.shape, self.dtype = arr, arr.shape, arr.dtype
        self.reads: list[int] = []

    def __len__(self):
        return len(self.arr)

    def __getitem__(self, idx):
        assert isinstance(idx, slice), f"expected a slice, got {idx!r}"
        out = self.arr[idx]
        self.reads.append(len(out))
        return out

    def __array__(self, *args, **kwargs):
        raise AssertionError("the whole image array was loaded into memory")


def make_images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, SIZE, SIZE, 3), dtype=np.uint8)


TEXTS = ["a cat", "a dog", "a cat", "two birds", "", "x" * CONTEXT, "zebra!"]


def direct_embeddings(enc: TinyEncoder, images: np.ndarray, texts: list[str]):
    with torch.no_grad():
        img = enc.encode_images(torch.stack([enc.preprocess(im) for im in images])).numpy()
        txt = enc.encode_texts(enc.tokenize(texts)).numpy()
    return img, txt


def test_tiny_encoder_implements_the_protocol():
    assert isinstance(TinyEncoder(), Encoder)


def test_embed_matches_direct_encoder_calls(tmp_path):
    enc = TinyEncoder()
    images = make_images(10)
    cache = embed(enc, images=images, texts=TEXTS, data_id="toy-v1", root=tmp_path, batch_size=3, progress=False)

    assert isinstance(cache, EmbeddingCache) and cache.hit is False
    assert cache.path == tmp_path / cache_key(enc.id, "toy-v1", "default")
    ref_img, ref_txt = direct_embeddings(TinyEncoder(), images, TEXTS)
    np.testing.assert_allclose(cache.image_emb, ref_img, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cache.text_emb, ref_txt, rtol=1e-5, atol=1e-6)
    assert cache.image_emb.dtype == np.float32 and cache.text_emb.shape == (len(TEXTS), 8)
    assert isinstance(cache.image_emb, np.memmap) and not cache.image_emb.flags.writeable
    assert cache.texts == TEXTS  # duplicates kept, in order
    # 10 images in batches of 3 -> 4 encoder calls; 7 texts -> 3.
    assert enc.calls["encode_images"] == 4 and enc.calls["encode_texts"] == 3

    manifest = json.loads((cache.path / "manifest.json").read_text())
    meta = manifest["info"]
    assert manifest["encoder_id"] == enc.id and meta["data_id"] == "toy-v1" and meta["preprocess_id"] == "default"
    assert meta["key"] == cache.path.name
    assert (meta["n_images"], meta["n_texts"], manifest["dim"]) == (10, 7, 8)
    assert (manifest["count"], manifest["texts"]["count"], manifest["index"]["parts"]) == (10, 7, [])
    assert meta["texts_sha256"] == sha256_json(TEXTS)
    assert manifest["created"]
    rows = pq.read_table(cache.path / "text_metadata" / "metadata_00000.parquet").column("text").to_pylist()
    assert rows == TEXTS
    assert sorted(str(p.relative_to(cache.path)) for p in cache.path.rglob("*") if p.is_file()) == [
        "img_emb/img_emb_00000.npy", "manifest.json", "metadata/metadata_00000.parquet", "text_emb/text_emb_00000.npy",
        "text_metadata/metadata_00000.parquet"
    ]  # fmt: skip
    assert sorted(os.listdir(tmp_path)) == [cache.path.name]  # no temporary leftovers


def test_repeated_call_is_a_hit_and_does_not_call_the_encoder(tmp_path):
    images = make_images(5)
    first = embed(TinyEncoder(), images=images, texts=TEXTS, data_id="toy", root=tmp_path, progress=False)
    enc = TinyEncoder()
    second = embed(enc, images=images, texts=TEXTS, data_id="toy", root=tmp_path, progress=False)
    assert second.hit is True and first.hit is False
    assert sum(enc.calls.values()) == 0
    assert second.path == first.path
    np.testing.assert_array_equal(second.image_emb, first.image_emb)
    np.testing.assert_array_equal(second.text_emb, first.text_emb)
    # Asking for a subset of what is cached is a hit too.
    assert embed(enc, texts=TEXTS, data_id="toy", root=tmp_path, progress=False).hit is True
    assert sum(enc.calls.values()) == 0


def test_keys_differ_by_every_id(tmp_path):
    k = cache_key("enc@1", "data", "default")
    assert len(k) == 16 and k == cache_key("enc@1", "data", "default")
    assert (
        len(
            {
                k,
                cache_key("enc@2", "data", "default"),
                cache_key("enc@1", "data2", "default"),
                cache_key("enc@1", "data", "crop"),
            }
        )
        == 4
    )
    assert cache_key("a|b", "c", "d") != cache_key("a", "b|c", "d")

    images = make_images(3)
    a = embed(TinyEncoder(seed=0), images=images, data_id="toy", root=tmp_path, progress=False)
    b = embed(TinyEncoder(seed=1), images=images, data_id="toy", root=tmp_path, progress=False)
    c = embed(TinyEncoder(seed=0), images=images, data_id="toy-other", root=tmp_path, progress=False)
    assert len({a.path, b.path, c.path}) == 3 and not (a.hit or b.hit or c.hit)
    assert not np.allclose(a.image_emb, b.image_emb)  # the encoders really differ


def test_open_with_another_encoder_is_refused(tmp_path):
    cache = embed(TinyEncoder(), texts=TEXTS, data_id="toy", root=tmp_path, progress=False)
    assert open_cache(cache.path, encoder_id="tiny-linear@seed0").texts == TEXTS
    with pytest.raises(VlctlError) as e:
        open_cache(cache.path, encoder_id="other-model@abc123")
    msg = str(e.value)
    assert "tiny-linear@seed0" in msg and "other-model@abc123" in msg and str(cache.path / "manifest.json") in msg
    assert "encoder" in msg


def test_crash_mid_write_leaves_nothing(tmp_path):
    enc = TinyEncoder(fail_after=1)  # the second image batch raises
    with pytest.raises(RuntimeError, match="simulated crash"):
        embed(enc, images=make_images(6), texts=TEXTS, data_id="toy", root=tmp_path, batch_size=2, progress=False)
    assert enc.calls["encode_images"] == 1  # it really crashed after writing a batch
    assert os.listdir(tmp_path) == []
    # The next run is a miss that computes everything.
    cache = embed(
        TinyEncoder(), images=make_images(6), texts=TEXTS, data_id="toy", root=tmp_path, batch_size=2, progress=False
    )
    assert cache.hit is False and cache.image_emb.shape == (6, 8)


def test_crash_while_extending_keeps_the_old_cache(tmp_path):
    old = embed(TinyEncoder(), texts=TEXTS, data_id="toy", root=tmp_path, progress=False)
    with pytest.raises(RuntimeError):
        embed(TinyEncoder(fail_after=0), images=make_images(2), data_id="toy", root=tmp_path, progress=False)
    again = open_cache(old.path, encoder_id=old.encoder_id)
    assert again.image_emb is None and again.texts == TEXTS
    assert sorted(os.listdir(tmp_path)) == [old.path.name]


def test_missing_modality_is_added_without_recomputing_the_other(tmp_path):
    first = embed(TinyEncoder(), texts=TEXTS, data_id="toy", root=tmp_path, progress=False)
    assert first.image_emb is None and first.info["n_images"] is None
    enc = TinyEncoder()
    images = make_images(4)
    both = embed(enc, images=images, data_id="toy", root=tmp_path, progress=False)
    assert both.hit is False and enc.calls["encode_texts"] == 0 and enc.calls["encode_images"] == 1
    assert both.texts == TEXTS
    np.testing.assert_array_equal(both.text_emb, open_cache(first.path).text_emb)
    np.testing.assert_allclose(both.image_emb, direct_embeddings(TinyEncoder(), images, TEXTS)[0], rtol=1e-5, atol=1e-6)


def test_same_key_with_other_data_is_refused(tmp_path):
    embed(TinyEncoder(), images=make_images(4), texts=TEXTS, data_id="toy", root=tmp_path, progress=False)
    with pytest.raises(VlctlError, match="other texts"):
        embed(TinyEncoder(), texts=TEXTS[:-1], data_id="toy", root=tmp_path, progress=False)
    with pytest.raises(VlctlError, match="holds 4 images, but 5"):
        embed(TinyEncoder(), images=make_images(5), data_id="toy", root=tmp_path, progress=False)


def test_corrupt_meta_is_refused_naming_the_file(tmp_path):
    cache = embed(TinyEncoder(), images=make_images(3), texts=TEXTS, data_id="toy", root=tmp_path, progress=False)
    meta_path = cache.path / "manifest.json"
    meta_path.write_text('{"encoder_id": "tiny-linear@seed0", "n_ima')
    with pytest.raises(VlctlError, match="corrupt") as e:
        open_cache(cache.path)
    assert str(meta_path) in str(e.value)
    # embed must not treat a corrupt cache as a hit, nor silently overwrite it.
    enc = TinyEncoder()
    with pytest.raises(VlctlError, match="manifest.json"):
        embed(enc, images=make_images(3), texts=TEXTS, data_id="toy", root=tmp_path, progress=False)
    assert sum(enc.calls.values()) == 0

    meta_path.unlink()
    with pytest.raises(VlctlError, match="not found") as e:
        open_cache(cache.path)
    assert str(meta_path) in str(e.value)


def test_bad_arrays_are_refused_naming_the_file(tmp_path):
    cache = embed(TinyEncoder(), images=make_images(3), texts=TEXTS, data_id="toy", root=tmp_path, progress=False)
    meta_path = cache.path / "manifest.json"
    meta = json.loads(meta_path.read_text())

    # Shape disagrees with the manifest.
    wrong = json.loads(json.dumps(meta))
    wrong["count"] = wrong["shards"][0]["rows"] = 4
    meta_path.write_text(json.dumps(wrong))
    with pytest.raises(VlctlError, match="img_emb_00000.npy") as e:
        open_cache(cache.path)
    assert "(4, 8)" in str(e.value)
    meta_path.write_text(json.dumps(meta))

    # Truncated array file.
    img_file = cache.path / "img_emb" / "img_emb_00000.npy"
    img_file.write_bytes(img_file.read_bytes()[:40])
    with pytest.raises(VlctlError, match="img_emb_00000.npy"):
        open_cache(cache.path)

    # Missing array file.
    img_file.unlink()
    with pytest.raises(VlctlError, match="img_emb_00000.npy.*missing"):
        open_cache(cache.path)

    # The texts edited behind the cache's back (same byte count, so only the hash can tell).
    cache = embed(TinyEncoder(), texts=TEXTS, data_id="toy2", root=tmp_path, progress=False)
    rows = cache.path / "text_metadata" / "metadata_00000.parquet"
    rows.write_bytes(rows.read_bytes().replace(b"a", b"b"))
    with pytest.raises(VlctlError, match="texts_sha256.*metadata_00000.parquet: sha256 differs"):
        open_cache(cache.path)

    with pytest.raises(VlctlError, match="not found"):
        open_cache(tmp_path / "nope")


def test_cache_of_vlctl_0_1_is_refused_with_how_to_convert(tmp_path):
    from vlctl.embeddings.cache import convert_cache

    old = tmp_path / "old"
    old.mkdir()
    emb = np.eye(3, 8, dtype=np.float32)
    np.save(old / "image_emb.npy", emb)
    np.save(old / "text_emb.npy", emb[:2])
    (old / "texts.json").write_text(json.dumps(["a", "b"]))
    (old / "meta.json").write_text(json.dumps({"format_version": 1, "encoder_id": "enc@1", "data_id": "d",
                                               "preprocess_id": "default", "key": "k", "n_images": 3,
                                               "n_texts": 2, "dim": 8, "dtype": "float32"}))
    with pytest.raises(VlctlError, match="vlctl 0.1.*convert"):
        open_cache(old)
    new = convert_cache(old, tmp_path / "new")
    np.testing.assert_array_equal(new.image_emb, emb)
    assert new.texts == ["a", "b"] and new.encoder_id == "enc@1"
    np.testing.assert_array_equal(open_cache(tmp_path / "new").text_emb, emb[:2])


def test_memmap_images_are_read_in_batches(tmp_path):
    images = make_images(11)
    mm = np.lib.format.open_memmap(tmp_path / "images.npy", mode="w+", dtype=np.uint8, shape=images.shape)
    mm[:] = images
    mm.flush()
    rec = RecordingArray(np.load(tmp_path / "images.npy", mmap_mode="r"))
    cache = embed(TinyEncoder(), images=rec, data_id="toy", root=tmp_path / "caches", batch_size=4, progress=False)
    assert rec.reads == [4, 4, 3]
    np.testing.assert_allclose(
        cache.image_emb, direct_embeddings(TinyEncoder(), images, ["a"])[0], rtol=1e-5, atol=1e-6
    )


def test_batched_preprocess_is_used_when_available(tmp_path):
    enc = BatchedTinyEncoder()
    images = make_images(5)
    cache = embed(enc, images=images, data_id="toy", root=tmp_path, batch_size=2, progress=False)
    assert enc.calls["preprocess_batch"] == 3 and enc.calls["preprocess"] == 0
    np.testing.assert_allclose(
        cache.image_emb, direct_embeddings(TinyEncoder(), images, ["a"])[0], rtol=1e-5, atol=1e-6
    )


def test_input_validation(tmp_path):
    enc = TinyEncoder()
    with pytest.raises(VlctlError, match="texts: empty"):
        embed(enc, texts=[], data_id="toy", root=tmp_path, progress=False)
    with pytest.raises(VlctlError, match="give images, texts or both"):
        embed(enc, data_id="toy", root=tmp_path, progress=False)
    with pytest.raises(VlctlError, match=r"images: expected an array of shape \(N, H, W, 3\)"):
        embed(enc, images=np.zeros((2, 4, 4), np.uint8), data_id="toy", root=tmp_path, progress=False)
    with pytest.raises(VlctlError, match="uint8"):
        embed(enc, images=np.zeros((2, 4, 4, 3), np.float32), data_id="toy", root=tmp_path, progress=False)
    # The tokenizer's own error for an over-long caption passes through, and nothing is left.
    with pytest.raises(VlctlError, match="exceed the context length"):
        embed(
            enc, images=make_images(2), texts=["ok", "y" * (CONTEXT + 1)], data_id="toy", root=tmp_path, progress=False
        )
    assert os.listdir(tmp_path) == []
