"""The one estimator contract of vlctl's methods (SAE, TEVI, ControlEmbed, TreeTuner).

Hyperparameters are declared once, as the fields of the estimator's frozen `Config` dataclass
(`vlctl.config.opt(default, "help", <range>)`: the help is the field's documentation and its
`--flag` help, the range (gt/ge/lt/le, choices, ...) what the constructor, set_params and the CLI
accept, a VlctlError naming the field otherwise; `add_config_args(parser, Est.Config,
exclude=Est.DATA_FIELDS)` makes the CLI). The training parameters (lr, epochs, batch_size, seed,
device, ...) are fields like any other.

    est = Est(config: Est.Config | None = None, *, progress=False, out_dir=None, **params)

`params` must be Config fields (anything else is refused with `UnknownParameterError`); they
override `config` (or the defaults). `est.config` is the frozen dataclass, `est.get_params()` it as
a dict, and `est.<field>` reads a field. `progress` (a tqdm bar) and `out_dir` (the training
loop's run directory; a temporary one when None) are runtime options, not hyperparameters.

    est.fit(source, ...) -> est

`source` is the embeddings: a store-like object (duck-typed: `.image_emb` (n, d), `.text_emb`
(n, d) or None -- the caption of image row i --, `.texts`, `.encoder_id`; a `vlctl` store or
embedding cache is one) or an (n, d) array with `encoder_id=`. `embedding_set` turns either into
checked arrays. The fields of the Config that come from the data (`DATA_FIELDS`, e.g. the
dimension d) are left None by the caller and filled in by fit; the resolved config is
`est.config_`. Everything learned ends in `_`; `encoder_id_` names the embedding space.

    est.save(dir) -> Path;  Est.load(dir, encoder_id=None) -> Est

in `vlctl.artifacts`: config.json (class, format version, the config, the encoder id) and a
safetensors file, written atomically; load refuses another encoder's space or another class.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from vlctl.config import check_values, validate_config
from vlctl.fsops import VlctlError


class UnknownParameterError(VlctlError, TypeError):
    """A keyword that is not a field of the estimator's Config (a typo must not pass silently)."""


def build_config(cls: type, config: Any, params: dict[str, Any], owner: str) -> Any:
    """`config` (an instance of `cls`, or None for the defaults) with `params` replacing fields; every
    field is checked against its declared type and range (`vlctl.config.opt`), the error naming it."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise UnknownParameterError(f"{owner}: unknown hyperparameter(s) {unknown}; the {cls.__name__} fields are "
                                    f"{names}")
    params = check_values(cls, params)  # before the dataclass's own cross-field checks compare them
    if config is None:
        return cls(**params)
    if not isinstance(config, cls):
        raise VlctlError(f"{owner}: config must be a {cls.__name__}, got {type(config).__name__}")
    return validate_config(dataclasses.replace(config, **params) if params else config)


class Estimator:
    """Base class: construction from one Config, get_params/set_params, save/load (module docstring)."""

    Config: ClassVar[type]
    DATA_FIELDS: ClassVar[tuple[str, ...]] = ()  # Config fields set from the data by fit (no CLI flag)
    WEIGHTS_FILE: ClassVar[str | None] = None  # the safetensors file of a saved estimator
    ARTIFACT_VERSION: ClassVar[int] = 1  # bump when a saved directory changes incompatibly
    REPLACES_DIR: ClassVar[bool] = True  # save replaces the whole directory (else writes into it)

    def __init__(self, config: Any = None, *, progress: bool = False, out_dir: str | Path | None = None, **params):
        self.config = build_config(type(self).Config, config, params, type(self).__name__)
        self.progress = progress
        self.out_dir = out_dir

    # -- hyperparameters

    def get_params(self) -> dict[str, Any]:
        """The hyperparameters: the config's fields as a dict."""
        return {f.name: getattr(self.config, f.name) for f in dataclasses.fields(self.config)}

    def set_params(self, **params) -> Estimator:
        """Replace config fields (refusing unknown ones); returns self. Fitted state is not touched."""
        self.config = build_config(type(self).Config, self.config, params, type(self).__name__)
        return self

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: config fields read as attributes (est.k).
        config = self.__dict__.get("config")
        if config is not None and not name.startswith("_") and name in {f.name for f in dataclasses.fields(config)}:
            return getattr(config, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        defaults = type(self).Config()
        changed = [f"{k}={v!r}" for k, v in self.get_params().items() if getattr(defaults, k) != v]
        return f"{type(self).__name__}({', '.join(changed)})"

    def _resolve(self, **from_data) -> Any:
        """The config with the DATA_FIELDS set from the data; refuses a caller's value that disagrees."""
        for k, v in from_data.items():
            given = getattr(self.config, k)
            if given is not None and given != v:
                raise VlctlError(f"{type(self).__name__}: {k}={given} was given, but the data gives {k}={v}")
        return dataclasses.replace(self.config, **check_values(type(self.config), from_data))

    def _check_fitted(self) -> Any:
        raise NotImplementedError

    # -- files (vlctl.artifacts)

    def save(self, path: str | Path) -> Path:
        """Write directory `path` atomically: config.json + the weights (see vlctl.artifacts)."""
        from vlctl.artifacts import save_estimator

        self._check_fitted()
        return save_estimator(self, path)

    @classmethod
    def load(cls, path: str | Path, encoder_id: str | None = None, **kwargs):
        """Load a saved estimator; VlctlError naming the file if it was fitted on another encoder than
        `encoder_id` (None: any), was written by another class or format version, or its weights do
        not match its config."""
        from vlctl.artifacts import load_estimator

        return load_estimator(cls, path, encoder_id, **kwargs)

    # Hooks for vlctl.artifacts: what to write, and how to rebuild from it.

    def _artifact_state(self) -> tuple[dict[str, torch.Tensor], dict, Any]:
        """(tensors for WEIGHTS_FILE, JSON-able fitted state, write_extra(dir) or None)."""
        raise NotImplementedError

    @classmethod
    def _from_artifact(cls, config: Any, encoder_id: str, tensors: dict[str, torch.Tensor], state: dict,
                       path: Path, *, cfg_path: Path, **kwargs):
        raise NotImplementedError

    @classmethod
    def _legacy_document(cls, path: Path) -> tuple[dict, Path] | None:
        """(An older directory's metadata as a current config.json document, the file it came from),
        or None when `path` is in no older layout this class reads (`vlctl.artifacts.legacy_document`)."""
        return None


# --- the embeddings source ---------------------------------------------------------------------


def as_matrix(x: Any, name: str = "embeddings") -> np.ndarray:
    """Array-like (n, d) -> float32 ndarray (no copy when it already is one), refusing a wrong rank,
    an empty set and NaN/Inf."""
    a = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if a.ndim != 2:
        raise VlctlError(f"{name} must be (n, d), got shape {a.shape}")
    if a.shape[0] == 0:
        raise VlctlError(f"{name} are empty (shape {a.shape})")
    a = a.astype(np.float32, copy=False)
    # block by block: a (n, d) mask of a store's memory map would be n * d bytes
    bad = np.concatenate([~np.isfinite(a[i:i + 65536]).all(1) for i in range(0, len(a), 65536)])
    if bad.any():
        rows = np.flatnonzero(bad)[:5].tolist()
        raise VlctlError(f"{name} contain NaN or Inf in {int(bad.sum())} row(s), e.g. rows {rows}")
    return a


def as_tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor sharing `a`'s memory. A read-only array (a store's memory map) is never written by
    the methods, so torch's warning about non-writable arrays is silenced rather than copying it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.as_tensor(a)


@dataclasses.dataclass(frozen=True)
class EmbeddingSet:
    """What `fit` learns from: checked float32 arrays and the encoder that made them."""

    image: np.ndarray  # (n, d)
    text: np.ndarray | None  # (n, d): the caption of image row i (paired, or text_emb given), or None
    texts: list[str] | None  # the caption strings, when asked for and the source has them
    encoder_id: str


def is_store_like(source: Any) -> bool:
    # the class first: `hasattr` on an instance runs a property, and a store's `image_emb` reads every row
    return all(hasattr(type(source), a) or hasattr(source, a) for a in ("image_emb", "encoder_id"))


def embedding_set(source: Any, *, encoder_id: str | None = None, text_emb: Any = None, paired: bool = False,
                  with_texts: bool = False, name: str = "embeddings", rows: bool = False) -> EmbeddingSet:
    """A store-like `source` (module docstring) or an (n, d) array with `encoder_id` -> EmbeddingSet.

    text_emb: with an array source, the (n, d) caption embeddings paired row by row.
    paired: the caller needs one caption per image row. A store with a `pairs()` method (a vlctl
        store, whose text rows name the image they describe) gives its (image, caption) pairs.
    with_texts: read the store's caption strings (`.texts`; a store parses them from its metadata).
    rows: a vlctl store's image rows come as its table (`images_table`), read on demand by the
        caller (`vlctl.methods.sae.rows.Rows`) instead of into memory; checked block by block.
    An encoder_id given with a store must be the store's.
    """
    texts, table = None, None
    if name == "embeddings" and is_store_like(source) and getattr(source, "path", None) is not None:
        name = f"{source.path}: embeddings"  # a NaN names the store it is in
    if is_store_like(source):
        if text_emb is not None:
            raise VlctlError(f"{name}: text_emb goes with an array source; a store brings its own text rows")
        sid = source.encoder_id
        if encoder_id is not None and encoder_id != sid:
            raise VlctlError(f"{name}: the store's embeddings come from encoder {sid!r}, not {encoder_id!r}")
        encoder_id = sid
        table = getattr(source, "images_table", None) if rows and not paired else None
        image = table if table is not None and len(table) else source.image_emb
        text = getattr(source, "text_emb", None) if paired else None  # unread unless needed
        if image is None:
            raise VlctlError(f"{name}: the store holds no image embeddings")
        texts = getattr(source, "texts", None) if with_texts else None
        if text is not None and hasattr(source, "pairs"):
            image, text = source.pairs()  # a store's own (image, caption) pairing of its text rows
    else:
        if not isinstance(encoder_id, str) or not encoder_id:
            raise VlctlError(f"{name}: an array of embeddings needs encoder_id= (the id of the encoder that made them)")
        image, text = source, text_emb
    where = name.removesuffix("embeddings") if name.endswith(": embeddings") else ""
    what = f"{where}image embeddings" if where or name == "embeddings" else name
    if table is None or image is not table:
        image = as_matrix(image, what)
    else:  # the store's table: its rows checked a block at a time (views of the memory maps), never all
        first = 0
        for block in table.chunks(65536):
            as_matrix(block, f"{what} (rows from {first})")
            first += len(block)
    if text is not None:
        text = as_matrix(text, f"{where}text embeddings")
        if text.shape[1] != image.shape[1]:
            raise VlctlError(f"text embeddings have dimension {text.shape[1]}, image embeddings {image.shape[1]}")
    if paired:
        if text is None:
            raise VlctlError(f"{name}: no caption embeddings (text_emb, or a store with text rows) to pair with the "
                             "images")
        if len(text) != len(image):
            raise VlctlError(f"{len(image)} image embeddings but {len(text)} captions; pair them row by row")
    return EmbeddingSet(image, text, texts, encoder_id)
