"""Galleries: embeddings + metadata + a FAISS index in one directory, searchable by text or image.

gallery = create_gallery("gal/", encoder.id, encoder.embed_dim, IndexConfig(kind="flat"))
gallery = gallery.add(embeddings, [{"path": ...}, ...])
gallery = open_gallery("gal/", encoder_id=encoder.id)
result = gallery.search_texts(encoder, ["a red car"], k=10)      # SearchResult(ids, scores)
result.hits(gallery)                                              # [[{"id", "score", **meta}]]
gallery.search(q, k=10, reranker=my_reranker, candidates=100)     # Reranker hook (TEVI, ControlEmbed)
"""

from vlctl.index.gallery import (
    INDEX_KINDS,
    Gallery,
    IndexConfig,
    Reranker,
    SearchResult,
    create_gallery,
    exact_rerank,
    open_gallery,
    open_or_create_gallery,
)

__all__ = [
    "INDEX_KINDS",
    "ExtractConfig",
    "ExtractResult",
    "Gallery",
    "ImageDecodeError",
    "IndexConfig",
    "Reranker",
    "SearchResult",
    "create_gallery",
    "embed_image_files",
    "exact_rerank",
    "index_images",
    "open_gallery",
    "open_or_create_gallery",
    "read_image",
]

_EXTRACT_NAMES = (
    "ExtractConfig",
    "ExtractResult",
    "ImageDecodeError",
    "embed_image_files",
    "index_images",
    "read_image",
)


def __getattr__(name: str):
    if name in _EXTRACT_NAMES:
        from vlctl.index import extract

        return getattr(extract, name)
    raise AttributeError(f"module 'vlctl.index' has no attribute {name!r}")
