"""TEVI: a caption-conditioned mask over an SAE's latents (estimator) and its all-pairs scoring."""
