"""The model side of `3vl-coco`: the base encoder (OpenCLIP or a Hugging Face CLIP), a seeded
copy of it with peft LoRA adapters, its forward for the training losses, and the base with saved
adapters merged back in (refused for another base)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vlctl.fsops import VlctlError
from vlctl.io import read_json
from vlctl.recipes.real_common import EncoderRun, LazyEncoder


def base_encoder(lazy: LazyEncoder):
    from vlctl.encoders.hf_encoder import HFEncoder
    from vlctl.encoders.open_clip_encoder import OpenCLIPEncoder

    enc = lazy.get()
    if isinstance(enc, HFEncoder) and enc.model_type != "clip":
        raise VlctlError(f"3vl-coco fine-tunes CLIP models (a softmax contrastive loss); {lazy.spec!r} is a "
                         f"Hugging Face {enc.model_type!r} model. Give --encoder open_clip:<model>[/<tag>] or "
                         "hf:<CLIP name or dir>")
    if not isinstance(enc, (OpenCLIPEncoder, HFEncoder)):
        raise VlctlError(f"3vl-coco fine-tunes OpenCLIP and Hugging Face CLIP models with peft LoRA; {lazy.spec!r} "
                         f"is a {type(enc).__name__}. Give --encoder open_clip:<model>[/<tag or checkpoint>] or "
                         "hf:<CLIP name or dir> (the TinyCLIP path is `vlctl fit tree` / the 3vl-scenes recipe)")
    return enc


def lora_kind(enc) -> str:
    from vlctl.encoders.hf_encoder import HFEncoder

    return "hf" if isinstance(enc, HFEncoder) else "open_clip"


def clip_forward(model, kind: str, x, tokens):
    """(image embeddings, text embeddings, logit scale) of the adapted model, both towers at once
    (one DDP forward). OpenCLIP's forward returns them normalised with exp(logit_scale); HF's
    CLIPModel returns image_embeds / text_embeds normalised, and its scale is read off the model."""
    if kind == "open_clip":
        return model(image=x, text=tokens)[:3]
    out = model(pixel_values=x, input_ids=tokens)
    inner = getattr(model, "module", model)  # DDP
    return out.image_embeds, out.text_embeds, inner.get_base_model().logit_scale.exp()


def fresh_model(lazy: LazyEncoder, cfg: Any):
    """A deep copy of the base OpenCLIP model with peft LoRA adapters (seeded)."""
    import copy

    import torch

    from vlctl.methods.threevl.lora import add_lora_peft

    base = base_encoder(lazy)
    model = copy.deepcopy(base.model).cpu()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return add_lora_peft(model, lora_kind(base), cfg.rank, cfg.lora_alpha)


def tuned_encoder(lazy: LazyEncoder, cfg: Any, adapters: Path, run: EncoderRun):
    """The base encoder with the saved adapters loaded and merged (refuses another base)."""
    from safetensors.torch import load_file

    from vlctl.encoders.open_clip_encoder import OpenCLIPEncoder
    from vlctl.methods.threevl.lora import lora_parameters

    base = base_encoder(lazy)
    doc = read_json(adapters / "adapter.json", "LoRA adapter.json")
    # The encoder id hashes the base weights (peft's MultiheadAttention adapter rewrites in_proj in
    # place during a forward, so a fingerprint of the adapted model is no stable identity).
    if doc.get("base_encoder_id") != base.id:
        raise VlctlError(f"{adapters}: adapters were trained on encoder {doc.get('base_encoder_id')!r}, this encoder "
                         f"is {base.id!r}; refusing to load them")
    peft_model = fresh_model(lazy, cfg)
    tensors = load_file(str(adapters / "adapters.safetensors"))
    params = lora_parameters(peft_model)
    if set(params) != set(tensors):
        raise VlctlError(f"{adapters}: adapter tensors do not match the model ({sorted(set(params) ^ set(tensors))[:3]})")
    import torch

    with torch.no_grad():
        for k, p in params.items():
            p.copy_(tensors[k])
    merged = peft_model.merge_and_unload().eval()
    spec = f"{base.spec}+lora:{adapters.parent.name}"
    if lora_kind(base) == "hf":
        from vlctl.encoders.hf_encoder import HFEncoder

        return HFEncoder(merged.to(run.device), base.tokenizer, base.processor, device=run.device,
                         precision=run.precision, batch_size=run.batch_size, spec=spec)
    return OpenCLIPEncoder(merged.to(run.device), base.model_name, base.preprocess_pil, base.tokenizer,
                           device=run.device, precision=run.precision, batch_size=run.batch_size,
                           spec=spec)
