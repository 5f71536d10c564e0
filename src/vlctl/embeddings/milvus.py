"""A Milvus collection as a store's search backend: one machine (Milvus Lite, embedded in a local
directory) or a Milvus server or cluster, through the same code.

    vlctl index STORE --backend milvus:photos.db           fill (or top up) the collection from the store
    vlctl search --backend milvus:photos.db --text "a red bicycle"
    vlctl serve --backend milvus:http://milvus:19530#photos

A backend is `milvus:TARGET[#COLLECTION]`: a TARGET ending in .db is Milvus Lite's data directory,
http(s)://HOST:PORT or HOST:PORT a server or cluster; COLLECTION defaults to "vlctl". A server
that asks for a token reads it from $VLCTL_MILVUS_TOKEN (never a flag, so it stays out of `ps`).

The collection: `id` INT64 primary key = the store's image row number, `vector` FLOAT_VECTOR(dim)
= the stored L2-normalised row, `meta` JSON = the row's metadata (path, captions, labels). Its
property "vlctl" (JSON) records the format, the encoder id and spec, the dim, the index config and
a hash of row 0 (which store it was filled from): another encoder's store, another store, or a
collection vlctl did not write is refused with one line; nothing of it is ever dropped.

Filling is batched and resumable: rows are inserted in ascending batches, and a rerun asks the
collection which ids of each batch it holds and inserts only the others (Milvus does not refuse a
duplicate primary key, so a re-inserted row would be found twice). Search is inner product (IP)
over the normalised rows, i.e. cosine, the same scores as the local store's. A `Reranker` (TEVI)
re-scores the top candidates with the vectors fetched in the same search call; ControlEmbed's
attribute query moves only the query, so it is a plain search here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlctl.config import config_from_dict, config_to_dict, opt, validate_config
from vlctl.embeddings.results import Reranker, SearchResult, rerank_candidates
from vlctl.embeddings.search import normalise
from vlctl.embeddings.store import Store
from vlctl.fsops import VlctlError

FORMAT = "vlctl.milvus/1"
DEFAULT_COLLECTION = "vlctl"
PROPERTY = "vlctl"  # the collection property holding what vlctl recorded (JSON)
MAX_TOPK = 16384  # Milvus's limit on a search's limit (topk)
FETCH_ROWS = 4096  # rows per get / query: well under gRPC's 64 MiB message limit at dim 4096
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
_HOST_PORT = re.compile(r"[A-Za-z0-9.\-]+:\d{1,5}")
INDEX_TYPES = ("HNSW", "IVF_FLAT", "FLAT", "AUTOINDEX")


@dataclasses.dataclass(frozen=True)
class MilvusConfig:
    """The collection's vector index and how it is filled and searched (`--milvus-*` flags)."""

    index: str = opt("HNSW", "vector index: HNSW (graph; Milvus Lite and servers), IVF_FLAT (inverted lists), "
                     "FLAT (exact search) or AUTOINDEX (the server's choice)", choices=INDEX_TYPES)
    m: int = opt(16, "HNSW: graph neighbours per node", ge=2, le=2048)
    ef_construction: int = opt(200, "HNSW: candidate list size while building", ge=1, le=10**6)
    ef: int = opt(128, "HNSW: candidate list size per query (recall vs speed; at least the candidates searched)",
                  ge=1, le=10**6)
    nlist: int = opt(1024, "IVF_FLAT: inverted lists (per segment in Milvus Lite)", ge=1, le=65536)
    nprobe: int = opt(32, "IVF_FLAT: inverted lists visited per query", ge=1, le=65536)
    batch: int = opt(2000, "rows per insert call while filling", ge=1, le=100_000)

    def __post_init__(self) -> None:
        validate_config(self)

    def index_params(self) -> dict:
        """The build parameters of `index` (Milvus's `params` of create_index)."""
        return {"HNSW": {"M": self.m, "efConstruction": self.ef_construction},
                "IVF_FLAT": {"nlist": self.nlist}}.get(self.index, {})

    def search_params(self, limit: int) -> dict:
        """The query-time parameters of `index` for a search of `limit` results."""
        return {"HNSW": {"ef": max(self.ef, limit)}, "IVF_FLAT": {"nprobe": self.nprobe}}.get(self.index, {})


@dataclasses.dataclass(frozen=True)
class Backend:
    """A parsed `milvus:TARGET[#COLLECTION]`: `uri` as pymilvus takes it, `collection`, `lite` (a .db path)."""

    uri: str
    collection: str
    lite: bool

    def __str__(self) -> str:
        return f"milvus:{self.uri}#{self.collection}"


def parse_backend(text: str, what: str = "--backend") -> Backend:
    """`milvus:TARGET[#COLLECTION]` -> Backend, or one line naming what is wrong."""
    kind, sep, rest = str(text).partition(":")
    target, _, name = rest.partition("#")
    form = "milvus:PATH.db (Milvus Lite), milvus:http(s)://HOST:PORT or milvus:HOST:PORT (a server), then #COLLECTION"
    if kind != "milvus" or not sep or not target:
        raise VlctlError(f"{what} {text!r}: expected {form}")
    name = name or DEFAULT_COLLECTION
    if not _NAME.fullmatch(name):
        raise VlctlError(f"{what} {text!r}: collection name {name!r} must be letters, digits and underscores, "
                         "not starting with a digit")
    if target.startswith(("http://", "https://")):
        return Backend(target, name, False)
    if target.endswith(".db"):
        path = Path(target).expanduser().resolve()
        if not path.parent.is_dir():
            raise VlctlError(f"{what} {text!r}: directory {path.parent} not found (Milvus Lite keeps its data in "
                             f"{path.name} there)")
        return Backend(str(path), name, True)
    if _HOST_PORT.fullmatch(target):
        return Backend(f"http://{target}", name, False)
    raise VlctlError(f"{what} {text!r}: expected {form}")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """pymilvus and Milvus Lite log every refused call with its traceback; vlctl says one line."""
    loggers = [logging.getLogger(n) for n in ("pymilvus", "milvus_lite", "grpc._server")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _call(backend: Backend, doing: str, fn, *args, **kw):
    """`fn(*args, **kw)` with a Milvus error as one line naming the backend and what was being done."""
    from pymilvus.exceptions import MilvusException

    with _quiet():
        try:
            return fn(*args, **kw)
        except MilvusException as e:
            msg = str(getattr(e, "message", "") or e).splitlines()[0]
            raise VlctlError(f"{backend}: {doing}: {msg}") from None


def connect(backend: Backend):
    """A pymilvus MilvusClient of `backend` (Milvus Lite starts in this process for a .db path)."""
    # gRPC's C core logs to stderr itself (Milvus Lite's server answers a client's keepalive pings
    # during a long insert with GOAWAY, which the client survives); vlctl's errors are one line.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    try:
        from pymilvus import MilvusClient
        from pymilvus.exceptions import MilvusException
    except ImportError:
        raise VlctlError(f"{backend}: the Milvus backend needs pymilvus and milvus-lite: pip install "
                         "'vlctl[milvus]'") from None
    token = os.environ.get("VLCTL_MILVUS_TOKEN", "")
    with _quiet():
        try:
            return MilvusClient(uri=backend.uri, token=token, timeout=60)
        except MilvusException as e:  # a .db another process holds, a server that does not answer
            busy = " (Milvus Lite serves one process: is another vlctl using it?)" if backend.lite else ""
            raise VlctlError(f"{backend}: cannot connect{busy}: {str(e).splitlines()[0]}") from None


def first_row_hash(store: Any) -> str:
    """Which store a collection was filled from: a hash of its row 0, the same through every add."""
    return hashlib.blake2b(np.ascontiguousarray(store.vectors([0]), np.float32).tobytes(), digest_size=16).hexdigest()


def _recorded(client, backend: Backend) -> dict | None:
    """The collection's "vlctl" property, None when it does not exist; refused when not vlctl's."""
    if not _call(backend, "listing collections", client.has_collection, backend.collection):
        return None
    props = _call(backend, "describing the collection", client.describe_collection, backend.collection)
    text = (props.get("properties") or {}).get(PROPERTY)
    try:
        rec = json.loads(text) if text else None
    except ValueError:
        rec = None
    if not isinstance(rec, dict) or rec.get("format") != FORMAT:
        raise VlctlError(f"{backend}: the collection exists and was not written by this vlctl (no {PROPERTY!r} "
                         f"property of format {FORMAT}); choose another #COLLECTION, it is left as it is")
    return rec


def _create(client, backend: Backend, store: Any, config: MilvusConfig) -> dict:
    from pymilvus import DataType, MilvusClient

    # encoder_spec and info: a vlctl store's; any object with the store's read API may lack them.
    rec = {"format": FORMAT, "encoder_id": store.encoder_id, "encoder_spec": getattr(store, "encoder_spec", None),
           "dim": store.dim, "first_row": first_row_hash(store), "config": config_to_dict(config),
           "info": dict(getattr(store, "info", None) or {}), "source": str(store.path)}
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=store.dim)
    schema.add_field("meta", DataType.JSON)
    index = client.prepare_index_params()
    index.add_index("vector", index_type=config.index, metric_type="IP", params=config.index_params())
    # Strong consistency: a search right after a fill sees every row it added.
    _call(backend, "creating the collection", client.create_collection, backend.collection, schema=schema,
          index_params=index, consistency_level="Strong", properties={PROPERTY: json.dumps(rec)})
    return rec


def _check_source(backend: Backend, rec: dict, store: Any, config: MilvusConfig | None) -> None:
    if rec["encoder_id"] != store.encoder_id or int(rec["dim"]) != store.dim:
        raise VlctlError(f"{backend}: the collection holds embeddings of encoder {rec['encoder_id']!r} (dim "
                         f"{rec['dim']}), the store {store.path} those of {store.encoder_id!r} (dim {store.dim}); "
                         "embeddings of different encoders are not comparable (fill another #COLLECTION)")
    if rec["first_row"] != first_row_hash(store):
        raise VlctlError(f"{backend}: the collection was filled from another store ({rec.get('source')}), not "
                         f"{store.path}: its row numbers would mean other images (fill another #COLLECTION)")
    if config is not None and config_to_dict(config) != rec["config"]:
        raise VlctlError(f"{backend}: the collection uses {rec['config']}, not the requested "
                         f"{config_to_dict(config)} (drop the --milvus-* flags to add to it as it is)")


def _present(client, backend: Backend, lo: int, hi: int) -> set[int]:
    rows = _call(backend, "reading the ids it holds", client.query, backend.collection,
                 filter=f"id >= {lo} and id < {hi}", output_fields=["id"])
    return {int(r["id"]) for r in rows}


def _count(client, backend: Backend, where: str = "") -> int:
    rows = _call(backend, "counting rows", client.query, backend.collection, filter=where, output_fields=["count(*)"])
    return int(rows[0]["count(*)"])


def _held_prefix(client, backend: Backend, n: int, batch: int) -> int:
    """The most whole batches' rows (at most n) whose ids the collection all holds: a binary search
    on count(id < m) == m, which holds up to the first missing row (no id is held twice)."""
    lo, hi = 0, -(-n // batch)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        m = min(mid * batch, n)
        lo, hi = (mid, hi) if _count(client, backend, f"id < {m}") == m else (lo, mid - 1)
    return min(lo * batch, n)


def fill(store: Any, backend: Backend | str, config: MilvusConfig | None = None, progress: bool = True) -> dict:
    """Add the store's image rows that the collection lacks (all of them to a new collection).

    `config` None keeps an existing collection's index (and gives a new one the defaults); a config
    that differs from the one recorded is refused. Returns {"added", "already_present", "count", ...}.
    """
    from vlctl.progress import heartbeat, progress_bar

    backend = parse_backend(backend) if isinstance(backend, str) else backend
    if len(store) == 0:
        raise VlctlError(f"{store.path}: the store holds no images; nothing to put in {backend}")
    client = connect(backend)
    rec = _recorded(client, backend)
    if rec is None:
        rec = _create(client, backend, store, config or MilvusConfig())
        held = 0
    else:
        _check_source(backend, rec, store, config)
        _call(backend, "loading the collection", client.load_collection, backend.collection)
        held = _count(client, backend)
    batch = config_from_dict(MilvusConfig, rec["config"], source=str(backend)).batch
    start = _held_prefix(client, backend, len(store), batch) if held else 0
    added = 0
    # An insert that flushes a segment waits for its index build (minutes at 100k rows): the
    # heartbeat keeps a line at least every 30 s.
    beat = heartbeat(f"milvus {backend.collection}") if progress else contextlib.nullcontext()
    with beat, progress_bar(total=len(store), desc=f"milvus {backend.collection}", unit="rows", initial=start,
                            disable=not progress) as bar:
        for lo in range(start, len(store), batch):
            hi = min(lo + batch, len(store))
            have = _present(client, backend, lo, hi) if held else set()
            ids = np.array([i for i in range(lo, hi) if i not in have], np.int64)
            if len(ids):
                vecs = np.asarray(store.vectors(ids), np.float32)
                rows = [{"id": int(i), "vector": v, "meta": m} for i, v, m in zip(ids, vecs, store.metadata(ids))]
                _call(backend, f"inserting rows {ids[0]}..{ids[-1]}", client.insert, backend.collection, rows)
                added += len(ids)
            bar.update(hi - lo)
    _call(backend, "flushing", client.flush, backend.collection)
    return {"backend": str(backend), "collection": backend.collection, "encoder_id": store.encoder_id,
            "index": rec["config"]["index"], "added": added, "already_present": len(store) - added,
            "count": _count(client, backend)}


class _Fetched:
    """The candidates of one search as a gallery for a `Reranker`: their vectors as Milvus returned
    them (no second round trip), the rest from the collection."""

    def __init__(self, owner: MilvusStore, vectors: dict[int, np.ndarray]):
        self.owner, self._vectors = owner, vectors
        self.path, self.encoder_id, self.dim = owner.path, owner.encoder_id, owner.dim

    def __len__(self) -> int:
        return len(self.owner)

    def vectors(self, ids) -> np.ndarray:
        ids = np.asarray(ids, np.int64).ravel()
        if all(int(i) in self._vectors for i in ids):
            return np.array([self._vectors[int(i)] for i in ids], np.float32).reshape(len(ids), self.dim)
        return self.owner.vectors(ids)

    def metadata(self, ids) -> list[dict]:
        return self.owner.metadata(ids)

    def check_encoder(self, encoder_id: str) -> None:
        self.owner.check_encoder(encoder_id)


class MilvusStore:
    """A filled collection with a store's read API: `search` (same arguments and `SearchResult`),
    `vectors`, `metadata`, `search_texts` / `search_images`, `check_encoder`, `len`. Open it with
    `open_milvus`."""

    texts = text_emb = None  # the collection holds image rows only
    hit = False
    remote = True  # its rows are read through the database, not memory-mapped

    def __init__(self, backend: Backend, client: Any, record: dict):
        self.backend, self.client, self.record = backend, client, record
        self.path = str(backend)
        self.config = config_from_dict(MilvusConfig, record["config"], source=self.path)
        self.count = _count(client, backend)

    encoder_id = property(lambda self: self.record["encoder_id"])
    encoder_spec = property(lambda self: self.record.get("encoder_spec"))
    dim = property(lambda self: int(self.record["dim"]))
    info = property(lambda self: self.record.get("info", {}))

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"MilvusStore({self.path!r}, encoder_id={self.encoder_id!r}, images={len(self)})"

    def shared(self) -> str:
        """This backend as another process reaches it: Milvus Lite's data directory is this
        process's alone, so its server's address (the gRPC server Milvus Lite runs here)."""
        if not self.backend.lite:
            return str(self.backend)
        from milvus_lite.server_manager import server_manager_instance

        return f"milvus:{server_manager_instance.start_and_get_uri(self.backend.uri)}#{self.backend.collection}"

    def adopt_encoder(self, encoder_id: str, encoder_spec: str | None) -> None:
        """Nothing to adopt: a collection records its store's encoder when filled (`check_encoder`)."""

    def check_encoder(self, encoder_id: str) -> None:
        if encoder_id != self.encoder_id:
            raise VlctlError(f"{self.path}: collection was filled with embeddings of encoder {self.encoder_id!r}, "
                             f"not {encoder_id!r}; embeddings of different encoders are not comparable")

    def _rows(self, ids: np.ndarray, field: str) -> list:
        out: dict[int, Any] = {}
        for s in range(0, len(ids), FETCH_ROWS):
            part = [int(i) for i in np.unique(ids[s : s + FETCH_ROWS])]
            for r in _call(self.backend, f"reading {field}", self.client.get, self.backend.collection, ids=part,
                           output_fields=[field]):
                out[int(r["id"])] = r[field]
        missing = [int(i) for i in ids if int(i) not in out]
        if missing:
            raise VlctlError(f"{self.path}: no row {missing[0]} (the collection holds {len(self)} rows)")
        return [out[int(i)] for i in ids]

    def vectors(self, ids: np.ndarray | Sequence[int]) -> np.ndarray:
        """Stored rows `ids` (m,) -> (m, dim) float32."""
        ids = np.asarray(ids, np.int64).ravel()
        return np.array(self._rows(ids, "vector"), np.float32).reshape(len(ids), self.dim)

    def metadata(self, ids: np.ndarray | Sequence[int] | None = None) -> list[dict]:
        ids = np.arange(len(self)) if ids is None else np.asarray(ids, np.int64).ravel()
        return [dict(m or {}) for m in self._rows(ids, "meta")]

    def embeddings(self) -> np.ndarray:
        """All rows (count, dim) float32, read from the collection (clustering reads them all)."""
        return self.vectors(np.arange(len(self)))

    image_emb = property(lambda self: self.embeddings() if len(self) else None)

    def search(self, queries: np.ndarray, k: int = 10, reranker: Reranker | None = None,
               candidates: int | None = None) -> SearchResult:
        """Top-k rows per query, as `vlctl.embeddings.store.Store.search` (same arguments and result)."""
        if k < 1:
            raise VlctlError(f"search: k must be >= 1, got {k}")
        q = normalise(queries[None] if np.ndim(queries) == 1 else queries, "search queries")
        if q.shape[1] != self.dim:
            raise VlctlError(f"search: queries have dim {q.shape[1]}, the collection {self.path} has dim {self.dim} "
                             f"(encoder {self.encoder_id})")
        n = min(k if reranker is None else max(k, candidates or 100), len(self), MAX_TOPK)
        ids = np.full((len(q), max(n, k)), -1, np.int64)
        scores = np.full(ids.shape, -np.inf, np.float32)
        if n == 0:
            return SearchResult(ids, scores)
        fields = ["vector"] if reranker is not None else []
        hits = _call(self.backend, "searching", self.client.search, self.backend.collection, data=q, limit=n,
                     anns_field="vector", output_fields=fields,
                     search_params={"metric_type": "IP", "params": self.config.search_params(n)})
        fetched = {}
        for r, row in enumerate(hits):
            for c, h in enumerate(row):
                ids[r, c], scores[r, c] = int(h["id"]), h["distance"]
                if reranker is not None:
                    fetched[int(h["id"])] = h["entity"]["vector"]
        if reranker is not None:
            ids, scores = rerank_candidates(q, ids, reranker, _Fetched(self, fetched))
        return SearchResult(ids[:, :k], np.where(ids[:, :k] >= 0, scores[:, :k], np.float32(-np.inf)))

    # Embed with `encoder` (the collection's, checked) and search: the store's own code.
    search_texts = Store.search_texts
    search_images = Store.search_images


def open_milvus(backend: Backend | str) -> MilvusStore:
    """The filled collection `backend` names, loaded for search; one line if it is absent or not vlctl's."""
    backend = parse_backend(backend) if isinstance(backend, str) else backend
    client = connect(backend)
    rec = _recorded(client, backend)
    if rec is None:
        raise VlctlError(f"{backend}: no such collection (fill it with `vlctl index STORE --backend "
                         f"milvus:{backend.uri}#{backend.collection}`)")
    _call(backend, "loading the collection", client.load_collection, backend.collection)
    return MilvusStore(backend, client, rec)
