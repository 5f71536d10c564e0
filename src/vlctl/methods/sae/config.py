"""The SAE's hyperparameters (`SparseAutoencoder.Config`), without torch: `vlctl fit sae --help`
builds its flags from them."""

from __future__ import annotations

import dataclasses

from vlctl.config import opt
from vlctl.fsops import VlctlError

SAE_DATA_FIELDS = ("d",)  # the Config fields fit sets from the data (no CLI flag)


@dataclasses.dataclass(frozen=True)
class TopKSAEConfig:
    """The SAE's hyperparameters, architecture and training alike (`SparseAutoencoder.Config`)."""

    d: int | None = opt(None, "input (embedding) dimension; set from the data by fit", ge=1, le=65536)
    expansion: int = opt(32, "d_latent = expansion * d when d_latent is not given", ge=1, le=1024)
    d_latent: int | None = opt(None, "number of latents d1 (overrides expansion)", ge=1, le=2**24)
    k: int = opt(128, "active latents per input (TopK)", ge=1, le=2**24)
    aux_k: int = opt(256, "dead latents used by the AuxK loss", ge=0, le=2**24)
    aux_coef: float = opt(1 / 32, "weight of the AuxK loss", ge=0, le=1000)
    dead_after: int = opt(200_000, "a latent not fired for this many training samples is dead", ge=0, le=10**12)
    resample_every: int = opt(0, "every this many training steps, re-initialise the dead latents towards the inputs "
                              "the SAE reconstructs worst in the batch (0: never; AuxK alone revives them)", ge=0,
                              le=10**9)
    init_b_pre: str = opt("geometric_median", "b_pre init from the data: geometric_median | mean | zeros",
                          choices=("geometric_median", "mean", "zeros"))
    concepts_fixed: bool = opt(False, "CG-SAE: decoder rows fixed to concept text embeddings, only the encoder "
                               "trains (set by SparseAutoencoder.from_concepts)")
    concepts_init: bool = opt(False, "decoder rows START at the concept text embeddings and train with the rest (TEVI "
                              "§4.2's learned SAE: the §3.3 setup with the decoder kept learnable; set by "
                              "SparseAutoencoder.from_concepts(fixed=False))", added=True)
    lr: float = opt(1e-3, "peak learning rate (AdamW, no weight decay)", gt=0, le=10)
    epochs: int = opt(50, "passes over the embeddings", ge=1, le=100_000)
    batch_size: int = opt(4096, "batch size (capped at the number of embeddings)", ge=1, le=2**20)
    warmup_steps: int = opt(0, "linear warmup steps", ge=0, le=10**9)
    seed: int = opt(0, "seed of the initialisation and the data order", ge=0, le=2**32 - 1)
    device: str | None = opt("cpu", "cpu or cuda (None: CUDA when available)", check="device")

    @property
    def n_latents(self) -> int | None:
        """d1; None while d is unknown and d_latent not given."""
        if self.d_latent is not None:
            return self.d_latent
        return None if self.d is None else self.expansion * self.d

    def __post_init__(self):
        if self.init_b_pre not in ("geometric_median", "mean", "zeros"):
            raise VlctlError(f"init_b_pre must be geometric_median, mean or zeros, got {self.init_b_pre!r}")
        if self.n_latents is not None and not 1 <= self.k <= self.n_latents:
            raise VlctlError(f"k={self.k} must be in [1, d_latent={self.n_latents}]")
        if self.k < 1:
            raise VlctlError(f"k={self.k} must be >= 1")
        if self.concepts_fixed and self.concepts_init:
            raise VlctlError("concepts_fixed (CG-SAE) and concepts_init (trained from the concepts) exclude each other")
        if self.aux_k < 0 or self.dead_after < 0:
            raise VlctlError(f"aux_k ({self.aux_k}) and dead_after ({self.dead_after}) must be >= 0")
