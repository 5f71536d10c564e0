"""One factory for every encoder vlctl can run: `create(spec)`, and the front door `load_encoder(spec)`.

    create("open_clip:ViT-B-32/laion2b_s34b_b79k")   OpenCLIP architecture + pretrained tag
    create("open_clip:ViT-B-16-SigLIP//ckpt/x.pt")   OpenCLIP architecture + checkpoint file
    create("open_clip:ViT-B-32")                     OpenCLIP architecture, random init, seed 0
    create("open_clip:ViT-B-32?seed=3")              OpenCLIP architecture, random init, seed 3
    create("hf:openai/clip-vit-base-patch32")        Hugging Face CLIP / SigLIP (name or directory)
    create("hf:cfg_dir?seed=0")                      HF config-only directory, random init, seed 0
    create("tiny:runs/clip/model")                   our TinyCLIP (a save_pretrained directory)
    create("runs/clip/model")                        the same: a bare directory is a TinyCLIP

Spec grammar:

    spec      := kind ":" body [ "?" options ]  |  directory           (a bare directory = tiny:)
    kind      := "open_clip" | "hf" | "tiny"
    body      := open_clip: <model> [ "/" <pretrained tag> | "/" <checkpoint path> ]
                 hf:        <hub name> | <directory>
                 tiny:      <directory>
    options   := "seed=" <non-negative integer>   (random weights only: open_clip without a tag
                                                   or checkpoint, hf config-only directories)

Random weights are always seeded: "open_clip:ViT-B-32" is seed 0, the same weights (and `id`) in
every process; for hf: the seed must be given (a directory whose weights are missing is an error,
never a silent random model). Every result satisfies the `Encoder` protocol (encoders/base.py);
its `id` is the architecture plus a hash of the weights ('/random-seed<N>' marks random ones), and
its `spec` the canonical spec: absolute paths, explicit seed, so it rebuilds the same encoder from
any working directory ("open_clip:ViT-B-32?seed=0", "tiny:/abs/runs/clip/model", ...).
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from vlctl.fsops import VlctlError

if TYPE_CHECKING:  # the spec grammar (SPEC_FORMS, parse_spec) needs no torch: `vlctl CMD --help` reads it
    import torch

    from vlctl.encoders.base import Encoder

SPEC_FORMS = (
    "open_clip:<model>[/<pretrained tag or checkpoint path>]  (no tag: random weights, [?seed=N], default 0)",
    "hf:<name or path>[?seed=N]  (?seed=N: random weights for a config-only directory)",
    "tiny:<checkpoint dir>",
)
KINDS = ("open_clip", "hf", "tiny")
DEFAULT_BATCH_SIZE = {"open_clip": 256, "hf": 256, "tiny": 1024}
_SEED = re.compile(r"[0-9]+")
_PREFIX = re.compile(r"[A-Za-z_][\w.-]*:")


@dataclasses.dataclass(frozen=True)
class ParsedSpec:
    """A spec split into its parts: kind ("open_clip" | "hf" | "tiny"), body and seed (or None)."""

    kind: str
    body: str
    seed: int | None = None


def parse_spec(spec: str | os.PathLike) -> ParsedSpec:
    """Split an encoder spec into kind, body and options (see the module docstring's grammar).

    An os.PathLike, or a string without a known 'kind:' prefix that names an existing directory
    (or looks like a path: '/', './', '~'), is a TinyCLIP directory. Nothing is loaded here.
    """
    if isinstance(spec, os.PathLike):
        return ParsedSpec("tiny", os.fspath(spec))
    if not isinstance(spec, str) or not spec.strip():
        raise VlctlError(f"encoder spec must be a non-empty string, one of {list(SPEC_FORMS)}; got {spec!r}")
    kind, sep, rest = spec.partition(":")
    if not (sep and kind in KINDS):
        # A directory; or something path-like without a 'word:' prefix, so that loading it says
        # "TinyCLIP model directory not found" rather than "unknown spec".
        if Path(spec).expanduser().is_dir() or (
            not _PREFIX.match(spec) and ("/" in spec or os.sep in spec or spec.startswith((".", "~")))
        ):
            return ParsedSpec("tiny", spec)
        raise VlctlError(
            f"unknown encoder spec {spec!r}; accepted encoder spec forms: {' | '.join(SPEC_FORMS)} "
            "(or a saved TinyCLIP directory)"
        )
    body, seed = rest, None
    if "?" in rest:
        body, _, query = rest.rpartition("?")
        seed = _parse_options(query, spec)
    if not body:
        what = {"open_clip": "OpenCLIP model name", "hf": "model name or path", "tiny": "checkpoint directory"}[kind]
        raise VlctlError(f"encoder spec {spec!r}: no {what} after '{kind}:'")
    return ParsedSpec(kind, body, seed)


def _parse_options(query: str, spec: str) -> int:
    seed = None
    for part in query.split("&"):
        key, eq, value = part.partition("=")
        if key != "seed" or not eq:
            raise VlctlError(f"encoder spec {spec!r}: unknown option {part!r} after '?'; the only option is seed=N")
        if seed is not None:
            raise VlctlError(f"encoder spec {spec!r}: seed given twice")
        if not _SEED.fullmatch(value) or int(value) >= 2**63:
            raise VlctlError(f"encoder spec {spec!r}: seed must be an integer in [0, 2**63), got {value!r}")
        seed = int(value)
    if seed is None:
        raise VlctlError(f"encoder spec {spec!r}: '?' must be followed by seed=N")
    return seed


def create(
    spec: str | os.PathLike, device: str | torch.device = "cpu", precision: str = "fp32", batch_size: int = 256
) -> Encoder:
    """Build the encoder named by `spec` (see the module docstring for the forms).

    Args:
        spec: the encoder spec string (or a TinyCLIP directory as a path).
        device: where the model runs ("cpu", "cuda", "cuda:1").
        precision: "fp32", or "fp16" / "bf16" autocast (weights stay fp32) for OpenCLIP / HF.
        batch_size: rows per forward pass inside encode_images / encode_texts.

    Raises:
        VlctlError: an unknown form or model, a missing checkpoint, weights that do not match
        the architecture, a seed where weights are loaded; the message names the spec and the problem.
    """
    p = parse_spec(spec)
    try:
        return _create(spec, p, device, precision, batch_size)
    except VlctlError as e:
        if "accepted encoder spec forms" in str(e):
            raise
        # The kind's own reason first, then every form a spec may take: a user who guessed a
        # form wrong sees at once what to write instead.
        raise VlctlError(f"{e}; accepted encoder spec forms: {' | '.join(SPEC_FORMS)}") from None


def _create(spec, p: ParsedSpec, device, precision: str, batch_size: int) -> Encoder:
    if p.kind == "open_clip":
        from vlctl.encoders.open_clip_encoder import create_open_clip_encoder, split_spec

        model_name, pretrained = split_spec(p.body)
        if not model_name:
            raise VlctlError(f"encoder spec {spec!r}: no OpenCLIP model name after 'open_clip:'")
        return create_open_clip_encoder(
            model_name, pretrained, device=device, precision=precision, batch_size=batch_size, seed=p.seed
        )
    if p.kind == "hf":
        from vlctl.encoders.hf_encoder import create_hf_encoder

        return create_hf_encoder(p.body, device=device, precision=precision, batch_size=batch_size, seed=p.seed)
    if p.seed is not None:
        raise VlctlError(
            f"encoder spec {spec!r}: a TinyCLIP directory holds trained weights and takes no ?seed "
            "(random TinyCLIPs: vlctl.encoders.create_model(config, seed=N))"
        )
    return _tiny(p.body, device, batch_size)


def load_encoder(
    spec: str | os.PathLike,
    device: str | torch.device = "cpu",
    precision: str = "fp32",
    batch_size: int | None = None,
) -> Encoder:
    """The front door: build any encoder from a spec, ready for `embed_texts` / `embed_images`.

    Like `create`, but `batch_size=None` takes the encoder kind's own default (TinyCLIP 1024,
    OpenCLIP / HF 256), so `load_encoder("runs/model")` is exactly the TinyCLIP loader it used to
    be. The result has `spec` (canonical), `id`, `embed_dim`, the `Encoder` methods and
    `embed_texts(texts)` / `embed_images(images)` -> float32 numpy (n, d), unit norm.
    """
    if batch_size is None:
        batch_size = DEFAULT_BATCH_SIZE[parse_spec(spec).kind]
    return create(spec, device=device, precision=precision, batch_size=batch_size)


def _tiny(path: str, device: str | torch.device, batch_size: int) -> Encoder:
    import torch

    from vlctl.encoders.tiny_encoder import TinyCLIPEncoder, tiny_spec
    from vlctl.encoders.tiny_pretrained import load_pretrained

    model = load_pretrained(Path(path).expanduser(), map_location=device)
    encoder = TinyCLIPEncoder(model, batch_size=batch_size, spec=tiny_spec(path))
    encoder.device = torch.device(device)  # where input batches go (vlctl.embeddings.cache reads this)
    return encoder
