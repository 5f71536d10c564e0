"""Embeddings: extraction from any source and the one store that holds them.

    store = vlctl.open_store("store/")                   # written by `vlctl embed` / `vlctl index`
    store.image_emb, store.text_emb, store.texts         # (n, d) memmaps, captions
    store.pairs()                                        # image-caption pairs, row by row
    store.search_texts(encoder, ["a red car"], k=10)     # SearchResult(ids, scores)
    store.metadata(ids)                                  # path, captions, labels of rows
"""
