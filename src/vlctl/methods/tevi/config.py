"""TEVI's hyperparameters (`TEVI.Config`), without torch: `vlctl fit tevi --help` builds its flags
from them."""

from __future__ import annotations

import dataclasses
import math

from vlctl.config import opt
from vlctl.fsops import VlctlError

TEVI_DATA_FIELDS = ("d", "n_latents", "latent_groups")  # the Config fields fit sets from the SAE (no CLI flag)
CONDITIONING = ("positive", "negative", "both")


@dataclasses.dataclass(frozen=True)
class TeviConfig:
    """TEVI's hyperparameters, mask and training alike (`TEVI.Config`)."""

    d: int | None = opt(None, "embedding dimension (image and text); set from the SAE by fit", ge=1, le=65536)
    n_latents: int | None = opt(None, "latents d1 of the SAE the mask acts on; set from the SAE by fit", ge=1, le=2**24)
    hidden: int = opt(512, "width of the mask MLP's two hidden layers", ge=1, le=16384)
    conditioning: str = opt("positive", "positive (Eq. 10: each image edited by its own caption) | negative "
                            "(Eq. 11: every image of the batch edited by every text of the batch) | both (their mean)",
                            choices=CONDITIONING)
    mask_init_bias: float = opt(0.0, "initial bias of the MLP's output layer: sigmoid(bias) is the initial mask value",
                                ge=-100, le=100)
    mask_temperature: float = opt(1.0, "m = sigmoid(f_m(t) / temperature); < 1 makes masks closer to binary",
                                  gt=0, le=100)
    mask_floor: float = opt(0.0, "at inference, mask values below this are set to 0 (training keeps the soft mask): a "
                            "latent kept at 0.1 still decides an argmax over its attribute's values", ge=0, lt=1)
    init_logit_scale: float = opt(math.log(1 / 0.07), "initial log inverse temperature of the InfoNCE (CLIP's)",
                                  ge=-10, le=10)
    learn_logit_scale: bool = opt(True, "train the InfoNCE temperature (at the mask's lr)")
    lr: float = opt(1e-3, "peak learning rate of the mask (AdamW, warmup + cosine)", gt=0, le=10)
    text_lr: float = opt(1e-6, "learning rate of a text encoder fine-tuned beside the mask (fit with text_encoder)",
                         ge=0, le=10)
    epochs: int = opt(10, "passes over the image-caption pairs", ge=1, le=100_000)
    batch_size: int = opt(256, "batch size (capped at the number of pairs); the InfoNCE's negatives", ge=1, le=16384)
    weight_decay: float = opt(0.0, "AdamW weight decay of the mask MLP's matrices", ge=0, le=10)
    mask_mass_coef: float = opt(0.0, "weight of a penalty on the mask's mean value (its total mass / d1) added to the "
                                "InfoNCE: pushes latents the caption does not need to 0", ge=0, le=1000)
    latent_groups: tuple[int, ...] | None = opt(None, "group id (0..G-1) of each latent, e.g. its attribute category "
                                                "on a CG-SAE: the MLP then outputs one mask value per group, shared "
                                                "by the group's latents; None: one free value per latent (the "
                                                "paper's mask)", ge=0, le=2**24)
    warmup_steps: int = opt(0, "linear warmup steps", ge=0, le=10**9)
    warmup_epochs: int = opt(0, "linear warmup over this many epochs' steps, added to warmup_steps (the paper, MAD: "
                             "5 of 25 epochs)", ge=0, le=100_000, added=True)
    seed: int = opt(0, "seed of the initialisation, the data order and the held-out images", ge=0, le=2**32 - 1)
    holdout: float = opt(0.1, "share of the images held out of the mask's training, each with all its captions: "
                         "CLIP, TEVI and the fused rerank are measured on their pairs and the fusion weight alpha is "
                         "chosen there; 0: none held out, and alpha is 1 (CLIP's ranking) unless given",
                         ge=0, lt=1, added=True)
    alpha: float | None = opt(None, "fusion weight of the rerank score alpha*CLIP + (1-alpha)*TEVI (1: CLIP's "
                              "ranking, 0: TEVI alone); None: chosen on the held-out pairs, from 1 down",
                              ge=0, le=1, added=True)
    device: str | None = opt("cpu", "cpu or cuda (None: CUDA when available)", check="device")

    def __post_init__(self):
        if self.conditioning not in CONDITIONING:
            raise VlctlError(f"conditioning must be one of {CONDITIONING}, got {self.conditioning!r}")
        if min(v for v in (self.d, self.n_latents, self.hidden) if v is not None) < 1 or self.mask_temperature <= 0:
            raise VlctlError(f"TeviConfig: d, n_latents, hidden and mask_temperature must be positive, got {self}")
        if not 0.0 <= self.mask_floor < 1.0:
            raise VlctlError(f"TeviConfig.mask_floor: must be in [0, 1), got {self.mask_floor}")
        if self.latent_groups is not None:
            groups = self.latent_groups
            if self.n_latents is not None and len(groups) != self.n_latents:
                raise VlctlError(f"TeviConfig.latent_groups: one group per latent needed, got {len(groups)} for "
                                 f"n_latents={self.n_latents}")
            if sorted(set(groups)) != list(range(max(groups) + 1)):
                raise VlctlError(f"TeviConfig.latent_groups: group ids must be 0..G-1 with every id used, got "
                                 f"{sorted(set(groups))[:10]}")
