"""TEVI explained with the latents' names (issue 46): which of an image's active SAE latents a
caption's mask keeps and which it drops.

TEVI's edited image is decode(z * m): z the image's TopK code, m = f_m(caption) in [0, 1] per
latent. A latent active in the image (z_r > 0) is kept when m_r >= KEEP (its part of the image
mostly survives the edit), dropped otherwise; each comes with its activation and mask value, and
its name (`vlctl.methods.sae.describe.decoder_names`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

KEEP = 0.5  # the sigmoid mask's midpoint: at or above it a latent keeps most of its activation


def kept_and_dropped(code: torch.Tensor, mask: torch.Tensor, names: Sequence[str] | None = None,
                     top: int = 8) -> dict:
    """One image's code (d1,) and one caption's mask (d1,) -> {"kept": [...], "dropped": [...]}, each
    the `top` active latents with the largest activation, as {latent, name, value, mask}."""
    z, m = np.asarray(code, dtype=np.float64), np.asarray(mask, dtype=np.float64)
    active = np.flatnonzero(z > 0)
    active = active[np.argsort(-z[active], kind="stable")]

    def row(r: int) -> dict:
        return {"latent": int(r), "name": None if names is None else names[r], "value": float(z[r]),
                "mask": float(m[r])}

    return {"kept": [row(r) for r in active if m[r] >= KEEP][:top],
            "dropped": [row(r) for r in active if m[r] < KEEP][:top]}


def explain_line(expl: dict, n: int = 4) -> str:
    """'kept: red 0.83 (m 0.97), 7 0.61 (m 0.88); dropped: thinning 0.40 (m 0.02)'."""
    def part(rows: list[dict]) -> str:
        return ", ".join(f"{r['name'] or '#' + str(r['latent'])} {r['value']:.2f} (m {r['mask']:.2f})"
                         for r in rows[:n]) or "none"

    return f"kept: {part(expl['kept'])}; dropped: {part(expl['dropped'])}"


def explain_results(tevi, store, text_emb, ids, encoder=None, names: Sequence[str] | None = None,
                    top: int = 8) -> list[list[dict]]:
    """For query q (a row of the text embeddings (Q, d)) and each store row of ids[q], the latents
    of that image the query's mask kept and dropped (`kept_and_dropped`), named with the store's
    vocabulary (`decoder_names`; `encoder`: the store's, default rebuilt from its spec; `names`: the
    latents' names computed before). `tevi`: a fitted TEVI of the store's encoder. What
    `search --explain` and `score tevi --explain` print, and the web page's Steer tab shows."""
    from vlctl.methods.sae.describe import decoder_names

    store.check_encoder(tevi.encoder_id_)
    if names is None:
        names = decoder_names(tevi.sae_.model_, store, encoder)
    masks = tevi.masks(text_emb)
    return [[kept_and_dropped(c, m, names, top) for c in tevi.sae_.encode(store.vectors(row))]
            for m, row in zip(masks, ids)]
