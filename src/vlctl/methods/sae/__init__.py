"""The TopK sparse autoencoder that TEVI edits embeddings through."""
