"""The three methods (TEVI, ControlEmbed, 3VL) and the sparse autoencoder TEVI edits through."""
