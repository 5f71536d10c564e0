"""Embeddings: extraction from any source and the one store that holds them.

    store = vlctl.open_store("store/")                   # written by `vlctl embed` / `vlctl index`
    store.image_emb, store.text_emb, store.texts         # (n, d) memmaps, captions
    store.pairs()                                        # image-caption pairs, row by row
    store.search_texts(encoder, ["a red car"], k=10)     # SearchResult(ids, scores)
    store.metadata(ids)                                  # path, captions, labels of rows
"""

from vlctl.embeddings.search import INDEX_KINDS, IndexConfig
from vlctl.embeddings.store import (
    Reranker,
    SearchResult,
    Store,
    create_store,
    exact_rerank,
    open_or_create_store,
    open_store,
)

__all__ = [
    "INDEX_KINDS",
    "IndexConfig",
    "Reranker",
    "SearchResult",
    "Store",
    "create_store",
    "exact_rerank",
    "open_or_create_store",
    "open_store",
]
