"""Encoders: the `Encoder` protocol and the models that implement it.

Front door (also `vlctl.load_encoder`):

    enc = load_encoder("open_clip:ViT-B-32/laion2b_s34b_b79k" | "hf:NAME_OR_DIR" | "tiny:DIR" | DIR)
    enc.embed_texts(["a photo of a cat"])           -> float32 (1, d), unit norm
    enc.embed_images(["cat.jpg", pil_image, array]) -> float32 (3, d), unit norm
    enc.spec, enc.id                                -> canonical spec, embedding-space identity

Factory surface (like open_clip's), each name imported from the module that defines it:

    factory.load_encoder(spec), factory.create(spec)   -> any Encoder (the spec grammar is factory's)
    tiny_config.list_configs()                          -> ["mad-minilm", "mad-paper", "mad-quick", ...]
    tiny_model.create_model("mad-quick", seed=0)        -> a freshly initialised TinyCLIP
    tiny_pretrained.save_pretrained(model, "out/model") -> model.safetensors + config.json
    tiny_encoder.load_tiny_encoder("out/model")         -> TinyCLIPEncoder (an Encoder)

TinyCLIP (the TEVI paper's MAD CLIP and friends) is five modules: tiny_config (configs/*.json),
tiny_model (the towers, preprocessing), tiny_pretrained (save / load), tiny_encoder (the Encoder),
loss (clip_loss); minilm.py is the frozen all-MiniLM-L6-v2 text tower.
"""
