"""Encoders: the `Encoder` protocol and the models that implement it.

Factory surface (like open_clip's):

    list_configs()                          -> ["mad-minilm", "mad-paper", "mad-quick"]
    create_model("mad-quick", seed=0)       -> a freshly initialised TinyCLIP
    save_pretrained(model, "out/model")     -> model.safetensors + config.json
    load_encoder("out/model")               -> TinyCLIPEncoder (an Encoder)
    create("open_clip:ViT-B-32/TAG" | "hf:NAME_OR_PATH" | "tiny:DIR")  -> any Encoder (factory.py)
"""

from vlctl.encoders.base import Encoder
from vlctl.encoders.factory import SPEC_FORMS, create
from vlctl.encoders.tiny_clip import (
    IMAGE_MEAN,
    IMAGE_STD,
    MAD_VALUES,
    TinyCLIP,
    TinyCLIPConfig,
    TinyCLIPEncoder,
    clip_loss,
    create_model,
    get_config,
    image_transform,
    list_configs,
    load_encoder,
    load_pretrained,
    preprocess_batch,
    save_pretrained,
)
from vlctl.encoders.tokenizer import MiniLMTokenizer, WordTokenizer

__all__ = [
    "IMAGE_MEAN",
    "IMAGE_STD",
    "MAD_VALUES",
    "SPEC_FORMS",
    "Encoder",
    "MiniLMTokenizer",
    "TinyCLIP",
    "TinyCLIPConfig",
    "TinyCLIPEncoder",
    "WordTokenizer",
    "clip_loss",
    "create",
    "create_model",
    "get_config",
    "image_transform",
    "list_configs",
    "load_encoder",
    "load_pretrained",
    "preprocess_batch",
    "save_pretrained",
]
