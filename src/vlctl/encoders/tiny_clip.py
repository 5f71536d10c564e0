"""TinyCLIP: a small CLIP trained from scratch (the TEVI paper's MAD CLIP and friends).

This module gathers TinyCLIP's public names, which live in smaller modules:

    tiny_config.py      TinyCLIPConfig, MAD_VALUES, list_configs(), get_config() (encoders/configs/*.json)
    tiny_model.py       the model (ViT image tower, word-transformer text tower, TinyCLIP),
                        image preprocessing (preprocess_batch, image_transform), create_model,
                        encoder_id
    minilm.py           the frozen all-MiniLM-L6-v2 text tower and its tokenizer
    loss.py             clip_loss (symmetric InfoNCE over the global batch under DDP)
    tiny_pretrained.py  save_pretrained / load_pretrained (model.safetensors + config.json)
    tiny_encoder.py     TinyCLIPEncoder (the vlctl Encoder), load_tiny_encoder(dir)

    model = create_model("mad-quick", seed=0)
    save_pretrained(model, "out/model")
    encoder = load_tiny_encoder("out/model")     # also: vlctl.load_encoder("out/model")

`load_encoder` here is the TinyCLIP directory loader kept under its old name (= load_tiny_encoder);
`vlctl.load_encoder` / `vlctl.encoders.load_encoder` take any encoder spec.

The attention fast-path switch `USE_SDPA_ON_CPU` is read by `tiny_model`; set it there.
"""

from vlctl.encoders.loss import clip_loss
from vlctl.encoders.minilm import MINILM_DIM, MiniLMText, MiniLMTokenizer, minilm_fingerprint, minilm_model_dir
from vlctl.encoders.tiny_config import (
    CONFIG_DIR,
    CONFIG_FILE,
    FORMAT,
    MAD_VALUES,
    WEIGHTS_FILE,
    TinyCLIPConfig,
    get_config,
    list_configs,
)
from vlctl.encoders.tiny_encoder import TinyCLIPEncoder, load_tiny_encoder, tiny_spec
from vlctl.encoders.tiny_model import (
    IMAGE_MEAN,
    IMAGE_STD,
    MAX_LOGIT_SCALE,
    Attention,
    Block,
    TextTransformer,
    TinyCLIP,
    VisionTransformer,
    create_model,
    encoder_id,
    image_transform,
    preprocess_batch,
    unwrap_model,
)
from vlctl.encoders.tiny_pretrained import load_pretrained, save_pretrained
from vlctl.encoders.tokenizer import WordTokenizer

load_encoder = load_tiny_encoder  # the old name of the TinyCLIP directory loader

__all__ = [
    "CONFIG_DIR",
    "CONFIG_FILE",
    "FORMAT",
    "IMAGE_MEAN",
    "IMAGE_STD",
    "MAD_VALUES",
    "MAX_LOGIT_SCALE",
    "MINILM_DIM",
    "WEIGHTS_FILE",
    "Attention",
    "Block",
    "MiniLMText",
    "MiniLMTokenizer",
    "TextTransformer",
    "TinyCLIP",
    "TinyCLIPConfig",
    "TinyCLIPEncoder",
    "VisionTransformer",
    "WordTokenizer",
    "clip_loss",
    "create_model",
    "encoder_id",
    "get_config",
    "image_transform",
    "list_configs",
    "load_encoder",
    "load_pretrained",
    "load_tiny_encoder",
    "minilm_fingerprint",
    "minilm_model_dir",
    "preprocess_batch",
    "save_pretrained",
    "tiny_spec",
    "unwrap_model",
]
