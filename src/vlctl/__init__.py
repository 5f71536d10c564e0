"""vlctl: make CLIP-style vision-language embedding spaces controllable with text.

Pipeline: data -> encoders -> embeddings -> methods -> eval -> recipes / index / serve.

Python front door (names are imported on first use, so `import vlctl` stays light and does not
import torch):

    import vlctl
    enc = vlctl.load_encoder("open_clip:ViT-B-32?seed=0")
    enc.embed_texts(["a cat"]), enc.embed_images(["cat.jpg"])
    store = vlctl.open_store("store/")                  # written by `vlctl embed`
    sae = vlctl.SparseAutoencoder(d_latent=128, k=8).fit(store)
"""

from __future__ import annotations

import importlib
import os
from typing import Any

__version__ = "0.1.0"

# OpenMP's idle threads spin by default, and on cores other processes also use, each parallel
# region then waits for a thread that is not running: a small MLP's 300 training steps took 163 s
# with 2 threads on 2 busy cores, and 1.8 s with PASSIVE (measured). Read when torch loads its
# OpenMP runtime, so it must be set before; a user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Public name -> "module:attribute", imported lazily by __getattr__ (PEP 562). To add a name, add
# it here and to __all__ (tests/test_front_door.py checks that the two agree).
_LAZY: dict[str, str] = {
    "load_encoder": "vlctl.encoders.factory:load_encoder",
    "open_store": "vlctl.embeddings.store:open_store",
    "create_store": "vlctl.embeddings.store:create_store",
    "SparseAutoencoder": "vlctl.methods.sae.model:SparseAutoencoder",
    "TEVI": "vlctl.methods.tevi.estimator:TEVI",
    "ControlEmbed": "vlctl.methods.controlembed.estimator:ControlEmbed",
    "TreeTuner": "vlctl.methods.threevl.tree_tune:TreeTuner",
}

__all__ = [
    "TEVI",
    "ControlEmbed",
    "SparseAutoencoder",
    "TreeTuner",
    "__version__",
    "create_store",
    "load_encoder",
    "open_store",
]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attr = target.partition(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
