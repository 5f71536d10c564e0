"""The names of vlctl 0.1, where a store with a FAISS index was a "gallery" (see vlctl.embeddings)."""

from vlctl.embeddings.build import index_images
from vlctl.embeddings.extract import ExtractConfig, ExtractResult, embed_image_files
from vlctl.embeddings.search import INDEX_KINDS, IndexConfig
from vlctl.embeddings.store import (
    Gallery,
    Reranker,
    SearchResult,
    create_gallery,
    exact_rerank,
    open_gallery,
    open_or_create_gallery,
)
from vlctl.images import ImageDecodeError, read_image

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
