"""The Latents tab of `vlctl serve`: what the served SAE learned (issue 46).

The SAE is the collection's (`Collection.sae`): `--sae`'s, or the one its TEVI model conditions. Its table of latents
is `SparseAutoencoder.describe` over the collection's store (names with their cosine and margin,
activation frequency, top images), computed once per collection, on a background job (a large
store takes minutes), and kept in `Collection.latents`; the listing and a latent's top images are
then read from it. The latents' top names alone (`latent_names`, what a TEVI steer shows beside a
kept or dropped latent) need no pass over the images and are computed on their own when the table
is not there yet.
"""

from __future__ import annotations

import threading
from typing import Any

from vlctl.fsops import VlctlError
from vlctl.methods.sae.describe import normalise
from vlctl.serve.state import Collection, NotFound

TOP_IMAGES = 16  # per latent, as `vlctl inspect sae` keeps by default
LISTED_IMAGES = 6  # top images per latent in the listing (all TOP_IMAGES when one is opened)


def _sae(coll: Collection) -> Any:
    if coll.sae is None:
        raise VlctlError(f"collection {coll.name!r}: no SAE is loaded (serve it with --sae, or with --tevi: the TEVI "
                         "model's SAE is the one shown)")
    return coll.sae


class _Locked:
    """The collection's encoder, each call under the collection's lock (the encoders keep state per
    call, `vlctl.serve.state`): describing the latents embeds the vocabulary with it, and only
    those calls wait for the requests' model calls, not the minutes of the rest."""

    def __init__(self, coll: Collection):
        self._coll = coll

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._coll.encoder, name)
        if not callable(attr):
            return attr

        def locked(*args, **kwargs):
            with self._coll.lock:
                return attr(*args, **kwargs)

        return locked


def _encoder(coll: Collection) -> Any:
    return None if coll.encoder is None else _Locked(coll)  # None: `describe` rebuilds it from the store's spec


def latent_names(coll: Collection) -> list[str]:
    """Each latent's top name (`decoder_names`: the vocabulary embedded once), computed once."""
    from vlctl.methods.sae.describe import decoder_names

    sae = _sae(coll)
    if "names" not in coll.latents:
        with coll.latents.setdefault("names_lock", threading.Lock()):  # not the table's: minutes
            if "names" not in coll.latents:
                coll.latents["names"] = decoder_names(sae.model_, coll.store, _encoder(coll))
    return coll.latents["names"]


def describe(coll: Collection) -> dict:
    """The SAE's live latents (`SparseAutoencoder.describe` over the store), computed once:
    {"summary": describe's summary, "rows": one dict per live latent, most frequent first, "keys":
    their names normalised}. What the job returns is the summary (`summary`)."""
    sae = _sae(coll)
    if "table" not in coll.latents:
        with coll.latents.setdefault("table_lock", threading.Lock()):
            if "table" not in coll.latents:
                rows = sae.describe(coll.store, k=TOP_IMAGES, encoder=_encoder(coll), as_frame=False)
                live = sorted((r for r in rows if r["live"]), key=lambda r: (-r["frequency"], r["latent"]))
                # Each name as a query is matched against it, once here, not per keystroke.
                keys = [[normalise(n["name"]) for n in r["names"]] for r in live]
                coll.latents["table"] = {"summary": sae.description_.summary, "rows": live, "keys": keys}
                coll.latents.setdefault("names", list(sae.latent_names_))
    return coll.latents["table"]


def summary(coll: Collection) -> dict:
    table = describe(coll)
    return {"collection": coll.name, "summary": table["summary"], "live": len(table["rows"])}


def _table(coll: Collection) -> dict:
    _sae(coll)
    if "table" not in coll.latents:
        raise VlctlError(f"collection {coll.name!r}: the SAE's latents are not described yet (POST /api/latents "
                         "starts it; the Latents tab does)")
    return coll.latents["table"]


def listing(coll: Collection, query: str | None, offset: int, limit: int) -> dict:
    """The live latents, most frequent first; with `query`, those with a name containing it (its
    words, lower case), the ones whose top name matches first, then by that name's cosine."""
    table = _table(coll)
    rows = table["rows"]
    if query and (q := normalise(query)):
        found = []
        for r, keys in zip(rows, table["keys"]):
            j = next((j for j, key in enumerate(keys) if q in key), None)
            if j is not None:
                found.append((j, -r["names"][j]["cosine"], r["latent"], r))
        rows = [r for *_, r in sorted(found, key=lambda t: t[:3])]
    page = [{**r, "top_images": r["top_images"][:LISTED_IMAGES], "top_values": r["top_values"][:LISTED_IMAGES]}
            for r in rows[offset:offset + limit]]
    return {"collection": coll.name, "total": len(rows), "offset": offset, "latents": page}


def detail(coll: Collection, latent: int) -> dict:
    """One live latent with its top images as the page shows images (`Collection.hit`, score: its activation)."""
    row = next((r for r in _table(coll)["rows"] if r["latent"] == latent), None)
    if row is None:
        n = int(coll.sae.model_.W_D.shape[0])
        raise NotFound(f"collection {coll.name!r}: latent {latent} is not a live latent of the SAE (it has {n} "
                       "latents; dead ones fire on no image)")
    return {**row, "collection": coll.name,
            "hits": [coll.hit(i, v) for i, v in zip(row["top_images"], row["top_values"])]}
