"""What `vlctl serve` serves: stores, their encoders and fitted models, loaded once at start.

A `ServeState` holds
  collections  name -> `Collection`: a store, the encoder that made it (text and image queries),
               the pixels of its rows (thumbnails), optionally a ControlEmbed model (steer by
               attribute, cluster) and a TEVI model (caption-conditioned rerank);
  explain      an `ExplainSet`: images with captions and one or more encoders (the base model and
               a tree-tuned one) for relevancy maps and caption-tree scores;
  reports      id -> `Report`: a `vlctl reproduce` report (report.html and its figure files).

Every model is loaded here, once, and shared by all requests. Torch modules are only read by
inference, but a HilaCAM pass needs gradients through the model and the encoders keep state per
call, so each collection and the explain set serialise their model calls with a lock; the numpy
search over the store runs outside it.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Any

import numpy as np

from vlctl.fsops import VlctlError
from vlctl.serve.config import TEXT_QUERY_CACHE

MAX_LABEL_CHARS = 200  # of a row's label shown under its thumbnail


class NotFound(LookupError):
    """An id the request names does not exist (HTTP 404)."""


def _short(text: str) -> str:
    return text if len(text) <= MAX_LABEL_CHARS else text[: MAX_LABEL_CHARS - 1] + "\u2026"




class _LRU:
    """A small thread-safe LRU cache (thumbnail PNGs, cluster results, text query embeddings)."""

    def __init__(self, size: int):
        self.size = size
        self._d: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            if key in self._d:
                self._d.move_to_end(key)
                return self._d[key]
        return None

    def put(self, key, value) -> None:
        with self._lock:
            self._d[key] = value
            self._d.move_to_end(key)
            while len(self._d) > self.size:
                self._d.popitem(last=False)


@dataclasses.dataclass(eq=False)
class Collection:
    """One searchable store.

    pixels: row -> uint8 (H, W, 3) (None: the store names no images, so no thumbnails);
    labels: row -> the text shown under its thumbnail (caption or attribute values), or None;
    files: row -> the path of its image file as the store records it (None: rows are no files);
    controlembed / tevi / sae: fitted on the store's encoder (checked by `check`); sae, the SAE of
    the Latents tab, is the TEVI model's when not given;
    pixelated: small synthetic images, upscaled with nearest-neighbour.
    """

    name: str
    store: Any
    encoder: Any = None
    pixels: Callable[[int], np.ndarray] | None = None
    labels: Callable[[int], str | None] | None = None
    controlembed: Any = None
    tevi: Any = None
    pixelated: bool = False
    description: str = ""
    subclass_names: dict[str, list[str]] | None = None
    files: Callable[[int], str | None] | None = None
    sae: Any = None

    def __post_init__(self) -> None:
        if self.sae is None:
            self.sae = getattr(self.tevi, "sae_", None)
        self.lock = threading.Lock()
        self.thumbs = _LRU(4096)
        self.latents: dict = {}  # the SAE's names and description, computed once (`vlctl.serve.latents`)
        self.clusters = _LRU(64)
        # Text -> its (1, d) embedding: a page sends the same few queries again and again, and the
        # text tower's forward (a MiniLM's six BERT layers) is most of a text search's CPU time.
        self.text_queries = _LRU(TEXT_QUERY_CACHE)
        self.affines = _LRU(256)  # attribute -> ControlEmbed's (W, b)
        self._emb: np.ndarray | None = None
        self._tevi_reranker = None
        self.check()

    def check(self) -> None:
        sid = self.store.encoder_id
        if self.encoder is not None and self.encoder.id != sid:
            raise VlctlError(f"{self.store.path}: store was built with encoder {sid!r}, the served encoder is "
                             f"{self.encoder.id!r}")
        for what, model in (("ControlEmbed", self.controlembed), ("TEVI", self.tevi), ("SAE", self.sae)):
            if model is not None and model.encoder_id_ != sid:
                raise VlctlError(f"{self.store.path}: the {what} model was fitted on encoder {model.encoder_id_!r}, "
                                 f"the store's embeddings come from {sid!r}")
        if len(self.store) == 0:
            raise VlctlError(f"{self.store.path}: the store holds no images")

    def __len__(self) -> int:
        return len(self.store)

    @property
    def attributes(self) -> list[str]:
        return list(self.controlembed.categories_) if self.controlembed is not None else []

    @property
    def free_text_attributes(self) -> bool:
        """Whether an attribute the model was not trained on can be typed (its text is embedded by
        the MiniLM condition encoder); a model fitted on given category embeddings knows only its own."""
        return self.controlembed is not None and self.controlembed.condition_id_ != "given"

    def subclasses(self, attribute: str) -> list[str]:
        """The attribute's subclass names: the model's own, or `subclass_names` where the model was
        fitted on label indices (0, 1, ...) and the set names them."""
        subs = [str(v) for v in (self.controlembed.subclasses_.get(attribute, []) if self.controlembed else [])]
        names = (self.subclass_names or {}).get(attribute)
        if names and all(v.isdigit() and int(v) < len(names) for v in subs):
            return [str(names[int(v)]) for v in subs]
        return subs

    def warm(self) -> None:
        """Run each model once, so lazily loaded parts (a MiniLM text tower) load now, not in a request."""
        if self.encoder is not None:
            try:
                self.text_query("a")
            except VlctlError:
                pass  # a word tokenizer without the word: the model is loaded all the same
        for a in self.attributes:
            self.affine(a)
        if self.tevi is not None:
            self.tevi_reranker()  # the SAE codes of every row, not in the first TEVI steer

    def embeddings(self) -> np.ndarray:
        """All image rows (n, d) float32 (read once)."""
        if self._emb is None:
            from vlctl.methods.base import as_matrix

            self._emb = as_matrix(self.store.image_emb, f"{self.store.path}: image embeddings")
        return self._emb

    def label(self, row: int) -> str | None:
        if self.labels is None:
            return None
        text = self.labels(row)
        return None if text is None else _short(text)

    def hit(self, row: int, score: float | None = None) -> dict:
        """The row as the page shows it: id, score, label (its caption), file (its name) and path."""
        return {"id": row, "score": score, "label": self.label(row), **file_fields(self.files, row)}

    # -- queries -----------------------------------------------------------------------------
    def _need_encoder(self) -> Any:
        if self.encoder is None:
            raise VlctlError(f"collection {self.name!r}: no encoder is loaded (the store records no encoder spec); "
                             "search by a stored image instead")
        return self.encoder

    def text_query(self, text: str) -> np.ndarray:
        """(1, d) embedding of `text`, from the cache when it was asked before (the same array: read-only)."""
        enc = self._need_encoder()
        q = self.text_queries.get(text)
        if q is None:
            with self.lock:
                q = np.asarray(enc.embed_texts([text]))
            self.keep_text(text, q)
        return q

    def cache_texts(self, texts: list[str]) -> dict[str, np.ndarray]:
        """Embed the `texts` missing from the text-query cache in one forward and keep them; returns
        text -> (1, d) embedding for every text it has. One forward of a few texts costs about one
        of one text: it reads the text tower's weights once (MiniLM: 22M floats). A text the
        tokenizer refuses is left out; its own request reports it (`text_query`)."""
        have = {t: q for t in dict.fromkeys(texts) if (q := self.text_queries.get(t)) is not None}
        todo = [t for t in dict.fromkeys(texts) if t not in have]
        if not todo or self.encoder is None:
            return have
        try:
            with self.lock:
                rows = np.asarray(self.encoder.embed_texts(todo))
        except VlctlError:
            if len(todo) > 1:
                for t in todo:
                    have.update(self.cache_texts([t]))
            return have
        for text, row in zip(todo, rows):
            have[text] = self.keep_text(text, row[None].copy())
        return have

    def keep_text(self, text: str, q: np.ndarray) -> np.ndarray:
        q.flags.writeable = False  # shared by every later request for this text
        self.text_queries.put(text, q)
        return q

    def pixel_query(self, rgb: np.ndarray) -> np.ndarray:
        enc = self._need_encoder()
        with self.lock:
            return enc.embed_images([rgb])

    def row_query(self, row: int) -> np.ndarray:
        self.check_row(row)
        return np.asarray(self.store.vectors([row]), dtype=np.float32)

    def check_row(self, row: int) -> None:
        if not 0 <= row < len(self):
            raise NotFound(f"collection {self.name!r}: no image {row} (it holds images 0..{len(self) - 1})")

    def tevi_reranker(self):
        """TEVI's reranker over this store, with the SAE codes of every row computed once."""
        if self.tevi is None:
            raise VlctlError(f"collection {self.name!r}: no TEVI model is loaded")
        with self.lock:
            if self._tevi_reranker is None:
                # A database's rows stay there: the candidates' codes are computed per query instead.
                remote = getattr(self.store, "remote", False)
                self._tevi_reranker = self.tevi.store_reranker(None if remote else self.tevi.encode_gallery(self.store))
        return self._tevi_reranker

    def affine(self, attribute: str):
        """ControlEmbed's (W, b) for `attribute`, computed once under the lock."""
        import warnings

        from vlctl.methods.controlembed.estimator import UntrainedAttributeWarning

        if self.controlembed is None:
            raise VlctlError(f"collection {self.name!r}: no ControlEmbed model is loaded (steering by attribute "
                             "needs one)")
        if attribute not in self.attributes and not self.free_text_attributes:
            raise VlctlError(f"attribute {attribute!r}: this ControlEmbed model knows only {', '.join(self.attributes)} (it was "
                             "fitted on given category embeddings, so free text cannot be embedded)")
        wb = self.affines.get(attribute)  # read without the lock: a steer never waits for a text forward
        if wb is None:
            with self.lock, warnings.catch_warnings():
                warnings.simplefilter("ignore", UntrainedAttributeWarning)  # the page says "not trained on" itself
                wb = self.controlembed.affine(attribute)
            self.affines.put(attribute, wb)
        return wb


@dataclasses.dataclass(eq=False)
class ExplainSet:
    """Images to explain: `count` rows, `pixels(row)` uint8 (H, W, 3), `captions(row)` the row's
    caption (the page's default positive) or None; `models` name -> encoder with a ViT image tower
    (the first is the base); `trees` a `TreeGenerator` for the caption tree (None: no tree)."""

    name: str
    count: int
    pixels: Callable[[int], np.ndarray]
    models: dict[str, Any]
    captions: Callable[[int], str | None] | None = None
    trees: Any = None
    pixelated: bool = False
    files: Callable[[int], str | None] | None = None

    def __post_init__(self) -> None:
        if not self.models:
            raise VlctlError("explain: no model to explain with")
        from vlctl.methods.threevl.relevancy import patch_geometry

        for name, enc in self.models.items():
            if patch_geometry(enc) is None:
                raise VlctlError(f"explain: model {name!r} ({enc.id}) has no ViT image tower with a class token; "
                                 "HilaCAM needs one")
        self.lock = threading.Lock()
        self.thumbs = _LRU(1024)
        self.tree_lock = threading.Lock()

    def warm(self) -> None:
        for enc in self.models.values():
            try:
                enc.embed_texts(["a"])
            except VlctlError:
                pass
        if self.trees is not None and self.captions is not None and self.count:
            try:
                self.trees.tree(self.captions(0))  # loads spaCy and WordNet
            except VlctlError:
                pass

    def check_row(self, row: int) -> None:
        if not 0 <= row < self.count:
            raise NotFound(f"explain set {self.name!r}: no image {row} (it holds images 0..{self.count - 1})")

    def caption(self, row: int) -> str | None:
        return None if self.captions is None else self.captions(row)


@dataclasses.dataclass(frozen=True)
class Report:
    """A `vlctl reproduce` report: `html` and the files it links to, by their name relative to the
    report's directory (the only names served)."""

    id: str
    title: str
    html: Path
    files: dict[str, Path]


@dataclasses.dataclass(eq=False)
class ServeState:
    collections: dict[str, Collection]
    explain: ExplainSet | None = None
    reports: dict[str, Report] = dataclasses.field(default_factory=dict)
    title: str = "vlctl"

    def __post_init__(self) -> None:
        if not self.collections and self.explain is None:
            raise VlctlError("serve: nothing to serve (no store and no explain set)")
        self.image_sources: dict[str, Any] = dict(self.collections)
        if self.explain is not None:
            self.image_sources["explain"] = self.explain

    def warm(self) -> None:
        for c in self.collections.values():
            c.warm()
        if self.explain is not None:
            self.explain.warm()

    def collection(self, name: str) -> Collection:
        if name not in self.collections:
            raise NotFound(f"no collection {name!r}; served: {', '.join(sorted(self.collections))}")
        return self.collections[name]


# --- loading ---------------------------------------------------------------------------------


def file_fields(files: Callable[[int], str | None] | None, row: int) -> dict:
    """{"file": the name of the row's image file, "path": its whole path} (None, None: not a file)."""
    path = None if files is None else files(row)
    return {"file": PurePath(path).name if path else None, "path": path}


def store_files(store: Any) -> Callable[[int], str | None] | None:
    """row -> the image file the store's metadata names ("path"); None when its rows name none."""
    if not len(store) or "path" not in store.metadata([0])[0]:
        return None
    return lambda row: store.metadata([row])[0].get("path")


def _image_file(path: str, max_pixels: int) -> np.ndarray:
    from vlctl.images import read_image

    return np.asarray(read_image(path, max_pixels), dtype=np.uint8)


def store_pixels(store: Any, data: str | Path | None = None, max_pixels: int = 89_478_485):
    """(pixels(row), labels(row)) of a store: its rows' image files ("path" in the metadata), or
    the generated set it was embedded from (recorded in its info, or `data`), checked to be the
    same data; (None, labels) when it names no images."""

    def caption_of(meta: dict) -> str | None:
        caps = meta.get("captions") or meta.get("caption")
        if isinstance(caps, list):
            caps = caps[0] if caps else None
        return caps if isinstance(caps, str) else None

    first = store.metadata([0])[0]
    if "path" in first:
        return (lambda row: _image_file(store.metadata([row])[0]["path"], max_pixels),
                lambda row: caption_of(store.metadata([row])[0]))
    source_dir = data or store.info.get("source")
    if source_dir:
        from vlctl.data.source import open_source

        source = open_source(source_dir)
        if source.data_id != store.info.get("data_id") or len(source) != len(store):
            raise VlctlError(f"{source.name}: not the data the store {store.path} was embedded from (data id "
                             f"{source.data_id!r}, the store records {store.info.get('data_id')!r})")
        return (lambda row: np.asarray(source.array[row]),
                lambda row: (source.captions[row] or [None])[0] or label_text(source.fields[row]))
    return None, lambda row: caption_of(store.metadata([row])[0])


def label_text(fields: dict) -> str | None:
    """A row's labels as one short line: its caption, else 'color=red, count=3'."""
    if isinstance(fields.get("caption"), str):
        return fields["caption"]
    parts = [f"{k}={v}" for k, v in fields.items() if isinstance(v, (str, int)) and not isinstance(v, bool)
             and k not in ("filename", "split", "index", "id")]
    return ", ".join(parts) or None


def find_reports(root: str | Path) -> dict[str, Report]:
    """Every report under `root` (a directory with report.html, or one level of them): its html
    and the files beside it (figures/*.png, arrays/README.md), named relative to it."""
    root = Path(root)
    dirs = [root] if (root / "report.html").is_file() else sorted(p for p in root.iterdir()
                                                                   if (p / "report.html").is_file())
    out = {}
    for d in dirs:
        files = {str(f.relative_to(d)): f for f in sorted(d.rglob("*"))
                 if f.is_file() and f.suffix.lower() in (".png", ".svg", ".md", ".json", ".html")}
        rid = d.name if d != root or not d.name.startswith(".") else "report"
        out[rid] = Report(rid, d.name, d / "report.html", files)
    return out


def state_for_store(store: str | Path | None, *, controlembed: str | Path | None = None,
                    tevi: str | Path | None = None, encoder: str | None = None, data: str | Path | None = None,
                    tuned: str | Path | None = None, reports: str | Path | None = None,
                    max_pixels: int = 89_478_485, sae: str | Path | None = None,
                    backend: str | None = None) -> ServeState:
    """The state of `vlctl serve STORE`: one collection (named after the store's directory), its
    encoder (`encoder` or the spec the store records), the given models, an explain set over its
    images when the encoder has a ViT tower (`tuned`: a second TinyCLIP to compare), `reports`.
    `backend` (instead of `store`): a Milvus collection filled from a store (`vlctl.embeddings.milvus`)."""
    from vlctl.encoders.factory import create

    if sae is not None and tevi is not None:  # a TEVI steer names the latents of its own SAE: one SAE per page
        raise VlctlError("serve: --sae goes without --tevi (the TEVI model's SAE is the one shown)")
    if backend is not None:
        from vlctl.embeddings.milvus import open_milvus

        st = open_milvus(backend)
        store = st.backend.collection
    else:
        from vlctl.embeddings.store import open_store

        st = open_store(store)
    spec = encoder or st.encoder_spec
    enc = create(spec) if spec else None
    if enc is not None:
        st.check_encoder(enc.id)
    ce = tv = None
    if controlembed is not None:
        from vlctl.methods.controlembed.estimator import ControlEmbed

        ce = ControlEmbed.load(controlembed, encoder_id=st.encoder_id)
    if tevi is not None:
        from vlctl.methods.tevi.estimator import TEVI

        tv = TEVI.load(tevi, encoder_id=st.encoder_id)
    if sae is not None:  # the Latents tab without TEVI
        from vlctl.methods.sae.model import SparseAutoencoder

        sae = SparseAutoencoder.load(sae, encoder_id=st.encoder_id)
    pixels, labels = store_pixels(st, data, max_pixels) if len(st) else (None, None)
    name = Path(store).resolve().name or "store"
    files = store_files(st)
    coll = Collection(name, st, enc, pixels, labels, ce, tv, description=f"{len(st)} images, encoder {st.encoder_id}",
                      files=files, sae=sae)
    explain = None
    if enc is not None and pixels is not None:
        from vlctl.methods.threevl.relevancy import patch_geometry

        if patch_geometry(enc) is not None:
            models = {"base": enc}
            if tuned is not None:
                models["tuned"] = create(str(tuned))
            from vlctl.captions.trees import TreeGenerator

            # A word-tokenizer TinyCLIP knows only its vocabulary: the trees' negatives must use it.
            cfg = getattr(enc, "config", None)
            words = getattr(cfg, "vocab", None) if getattr(cfg, "text_tower", None) == "transformer" else None
            vocab = set(words) if words else None
            explain = ExplainSet(name, len(st), pixels, models, labels, TreeGenerator(vocabulary=vocab), files=files)
    return ServeState({name: coll}, explain, find_reports(reports) if reports else {}, title=f"vlctl \u00b7 {name}")
