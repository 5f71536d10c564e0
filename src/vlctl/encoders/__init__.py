"""Encoders: the `Encoder` protocol and the models that implement it.

Front door (also `vlctl.load_encoder`):

    enc = load_encoder("open_clip:ViT-B-32/laion2b_s34b_b79k" | "hf:NAME_OR_DIR" | "tiny:DIR" | DIR)
    enc.embed_texts(["a photo of a cat"])           -> float32 (1, d), unit norm
    enc.embed_images(["cat.jpg", pil_image, array]) -> float32 (3, d), unit norm
    enc.spec, enc.id                                -> canonical spec, embedding-space identity

Factory surface (like open_clip's):

    list_configs()                          -> ["mad-minilm", "mad-paper", "mad-quick", ...]
    create_model("mad-quick", seed=0)       -> a freshly initialised TinyCLIP
    save_pretrained(model, "out/model")     -> model.safetensors + config.json
    load_tiny_encoder("out/model")          -> TinyCLIPEncoder (an Encoder)
    create("open_clip:ViT-B-32[/TAG][?seed=N]" | "hf:NAME_OR_PATH[?seed=N]" | "tiny:DIR")
                                            -> any Encoder (factory.py; spec grammar there)
"""

from vlctl.encoders.base import Encoder, FrontDoor, SupportsTokenRemoval, seeded_init
from vlctl.encoders.factory import SPEC_FORMS, ParsedSpec, create, load_encoder, parse_spec
from vlctl.encoders.loss import all_gather_with_grad, clip_loss
from vlctl.encoders.minilm import MiniLMTokenizer
from vlctl.encoders.tiny_config import MAD_VALUES, TinyCLIPConfig, get_config, list_configs
from vlctl.encoders.tiny_encoder import TinyCLIPEncoder, load_tiny_encoder
from vlctl.encoders.tiny_model import (
    IMAGE_MEAN,
    IMAGE_STD,
    TinyCLIP,
    create_model,
    encoder_id,
    image_transform,
    preprocess_batch,
)
from vlctl.encoders.tiny_pretrained import load_pretrained, save_pretrained
from vlctl.encoders.tokenizer import WordTokenizer

__all__ = [
    "IMAGE_MEAN",
    "IMAGE_STD",
    "MAD_VALUES",
    "SPEC_FORMS",
    "Encoder",
    "FrontDoor",
    "MiniLMTokenizer",
    "ParsedSpec",
    "SupportsTokenRemoval",
    "TinyCLIP",
    "TinyCLIPConfig",
    "TinyCLIPEncoder",
    "WordTokenizer",
    "all_gather_with_grad",
    "clip_loss",
    "create",
    "create_model",
    "encoder_id",
    "get_config",
    "image_transform",
    "list_configs",
    "load_encoder",
    "load_pretrained",
    "load_tiny_encoder",
    "parse_spec",
    "preprocess_batch",
    "save_pretrained",
    "seeded_init",
]
