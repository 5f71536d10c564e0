"""What each endpoint of `vlctl serve` computes, as plain functions of the state and a validated
request (the app runs them in a worker thread under a timeout). Every number comes from the
library's own methods: `Store.search`, `ControlEmbed.affine` / `cluster`, TEVI's gallery
reranker, `explain_maps`, the caption trees of `vlctl.captions.trees`."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from vlctl.fsops import VlctlError
from vlctl.serve import imaging
from vlctl.serve.state import Collection, ExplainSet, file_fields


def _hits(coll: Collection, ids: np.ndarray, scores: np.ndarray) -> list[dict]:
    return [coll.hit(int(i), float(s)) for i, s in zip(ids, scores) if i >= 0]


def query_vector(coll: Collection, text: str | None, image_id: int | None, pixels: np.ndarray | None = None):
    """(1, d) query embedding and its description."""
    if pixels is not None:
        return coll.pixel_query(pixels), {"image": "upload", "size": list(pixels.shape[:2])}
    if text is not None:
        return coll.text_query(text), {"text": text}
    return coll.row_query(int(image_id)), {"image_id": int(image_id), **file_fields(coll.files, int(image_id))}


def search(coll: Collection, text: str | None, image_id: int | None, k: int, pixels: np.ndarray | None = None):
    q, query = query_vector(coll, text, image_id, pixels)
    res = coll.store.search(q, k=min(k, len(coll)))
    return {"collection": coll.name, "query": query, "hits": _hits(coll, res.ids[0], res.scores[0])}


def steer(coll: Collection, req: Any) -> dict:
    """ControlEmbed query mode (one attribute or the alpha blend of two) or TEVI rerank; see
    `schemas.SteerRequest`."""
    k = min(req.k, len(coll))
    if req.tevi:
        rerank = coll.tevi_reranker()
        q = coll.text_query(req.text)
        base = coll.store.search(q, k=min(req.candidates, len(coll)))
        ids, before = base.ids, base.scores
        after = np.asarray(rerank(q, ids, coll.store), dtype=np.float32)[0]
        after = np.where(ids[0] >= 0, after, -np.inf)
        order = [j for j in np.argsort(-after, kind="stable")[:k] if ids[0, j] >= 0]
        shown = [int(ids[0, j]) for j in order]
        latents = tevi_latents(coll, q, shown)
        hits = [{**coll.hit(row, float(after[j])), "before_rank": int(j) + 1, "before_score": float(before[0, j]),
                 "moved": m, **latents[r]}
                for r, (row, j, m) in enumerate(zip(shown, order, moved([int(j) for j in order])))]
        return {"collection": coll.name, "query": {"text": req.text, "candidates": int(ids.shape[1])}, "mode": "tevi",
                "note": f"the top {ids.shape[1]} by cosine, re-scored by the fused score: {rerank.fusion['note']}",
                "hits": hits}
    q, query = query_vector(coll, req.text, req.image_id)
    from vlctl.methods.controlembed.estimator import normalize_rows

    q = normalize_rows(q)
    w, b = coll.affine(req.attribute)
    steered = q @ w + b
    mode, note = "attribute", ""
    if req.attribute_b is not None:
        wb, bb = coll.affine(req.attribute_b)
        steered = req.alpha * steered + (1.0 - req.alpha) * (q @ wb + bb)
        mode = "compose"
    untrained = [a for a in (req.attribute, req.attribute_b) if a is not None and a not in coll.attributes]
    if untrained:
        note = (f"not trained on: {', '.join(untrained)}; the maps come from the MiniLM embedding of the text "
                f"(trained on: {', '.join(coll.attributes)})")
    res = coll.store.search(steered, k=k)
    query.update(attribute=req.attribute, **({"attribute_b": req.attribute_b, "alpha": req.alpha}
                                               if req.attribute_b is not None else {}))
    return {"collection": coll.name, "query": query, "mode": mode, "note": note,
            "hits": _hits(coll, res.ids[0], res.scores[0])}


def moved(before: list[int]) -> list[bool]:
    """Which reranked results moved, given the cosine rank each came from (in the order shown).

    Those on one longest increasing run of `before` kept their order among themselves: they only
    made room for the others (one result jumping from #30 to #1 pushes the rest down one place, and
    it alone moved). The rest are the fewest results whose moves turn the cosine order into the new
    one. The run is the one patience sorting finds (a swapped pair: the one that rose moved)."""
    import bisect

    tails: list[int] = []  # the smallest last rank of an increasing run of each length
    ends: list[int] = []  # where that run ends
    prev = [-1] * len(before)
    for i, b in enumerate(before):
        j = bisect.bisect_left(tails, b)
        prev[i] = ends[j - 1] if j else -1
        if j == len(tails):
            tails.append(b)
            ends.append(i)
        else:
            tails[j], ends[j] = b, i
    stayed, i = set(), ends[-1] if ends else -1
    while i >= 0:
        stayed.add(i)
        i = prev[i]
    return [i not in stayed for i in range(len(before))]


LATENTS_SHOWN = 4  # kept and dropped latents shown per TEVI result


def tevi_latents(coll: Collection, q: np.ndarray, rows: list[int]) -> list[dict]:
    """Per row, {"kept": [...], "dropped": [...]}: its active SAE latents that the mask of the query
    text `q` (1, d) keeps and drops, named (`vlctl.methods.tevi.explain`, what `--explain` prints)."""
    from vlctl.methods.tevi.explain import explain_results
    from vlctl.serve.latents import latent_names

    if not rows:
        return []
    [expl] = explain_results(coll.tevi, coll.store, q, [rows], names=latent_names(coll), top=LATENTS_SHOWN)
    return expl


def cluster_names(sims: np.ndarray, names: list[str]) -> list[str]:
    """(k, S) cosines of cluster centres with the S subclass texts -> a distinct name per cluster: each
    subclass names at most one cluster, chosen for the largest total cosine (scipy's
    `linear_sum_assignment`); clusters left over (k > S) take their nearest subclass, numbered
    ("red (2)")."""
    from scipy.optimize import linear_sum_assignment

    out: list[str | None] = [None] * len(sims)
    rows, cols = linear_sum_assignment(sims, maximize=True)
    for r, c in zip(rows, cols):
        out[r] = names[c]
    taken = {n: 1 for n in out if n is not None}
    for r in np.argsort(-sims.max(1), kind="stable"):
        if out[r] is None:
            n = names[int(np.argmax(sims[r]))]
            taken[n] = taken.get(n, 0) + 1
            out[r] = f"{n} ({taken[n]})"
    return out


def cluster(coll: Collection, attribute: str, k: int | None, seed: int, per_cluster: int) -> dict:
    """`vlctl cluster` in memory: ControlEmbed k-means of the whole collection by `attribute`; per
    cluster its size, the rows nearest its centre (in the space k-means ran in) and a subclass name
    of its own (`cluster_names`: the subclass texts nearest the centres, each used once)."""
    from vlctl.methods.controlembed.estimator import normalize_rows

    t0 = time.perf_counter()
    model = coll.controlembed
    coll.affine(attribute)  # checks the attribute and fills the model's cache under the lock
    if k is None:
        if attribute not in model.subclasses_:
            raise VlctlError(f"attribute {attribute!r} was not trained on: give k (the number of clusters)")
        k = len(model.subclasses_[attribute])
    if k > len(coll):
        raise VlctlError(f"k={k} is larger than the collection ({len(coll)} images)")
    emb = coll.embeddings()
    ids = model.cluster(emb, attribute, k, seed=seed, encoder_id=coll.store.encoder_id)
    z = normalize_rows(model.transform(emb, attribute, encoder_id=coll.store.encoder_id))
    texts = (model.class_text_emb_ or {}).get(attribute)
    clusters, centres = [], []
    for c in range(k):
        members = np.flatnonzero(ids == c)
        info: dict = {"id": c, "size": len(members), "subclass": None, "nearest": [], "images": []}
        if len(members):
            centre = z[members].mean(0)
            centres.append((c, centre / max(float(np.linalg.norm(centre)), 1e-12)))
            dist = np.linalg.norm(z[members] - centre, axis=1)
            info["nearest"] = members[np.argsort(dist, kind="stable")[:per_cluster]].tolist()
        info["images"] = [coll.hit(i) for i in info["nearest"]]
        clusters.append(info)
    if texts is not None and centres:
        sims = np.stack([c for _, c in centres]) @ np.asarray(texts).T
        for (c, _), name in zip(centres, cluster_names(sims, coll.subclasses(attribute))):
            clusters[c]["subclass"] = name
    clusters.sort(key=lambda c: -c["size"])
    return {"collection": coll.name, "attribute": attribute, "k": int(k), "n_images": len(ids),
            "seconds": time.perf_counter() - t0, "clusters": clusters}


METHODS = (("hilacam_positive", "HilaCAM of P"), ("hilacam_negative", "HilaCAM of N"),
           ("anchor", "Anchor (\u201cAP or AN\u201d)"), ("dire", "DiRe (P \u2212 N)"))
DISPLAY_SIDE = 256  # pixels of the longer side of a heatmap shown on the page


def _tree_scores(enc: Any, image: np.ndarray, levels: list[dict]) -> list[dict]:
    """Cosine of the image with each level's positive and negatives (the letterboxed image, as the maps see it)."""
    from vlctl.methods.threevl.explain import letterbox

    img = enc.embed_images([letterbox(image).image])[0]
    out = []
    for lv in levels:
        texts = [lv["positive"], *lv["negatives"]]
        s = enc.embed_texts(texts) @ img
        out.append({"positive": lv["positive"], "positive_score": float(s[0]), "negatives": list(lv["negatives"]),
                    "negative_scores": [float(v) for v in s[1:]], "fails": [bool(v >= s[0]) for v in s[1:]]})
    return out


def explain(es: ExplainSet, row: int | None, positive: str, negative: str | None, tree: bool = True,
            pixels: np.ndarray | None = None) -> dict:
    """The relevancy maps of every model of the explain set for image `row` (or the uploaded
    `pixels`, uint8 (H, W, 3)) (`explain_maps`: HilaCAM of P, and with a negative HilaCAM of N,
    Anchor and DiRe), drawn over the whole image at DISPLAY_SIDE px with one colour scale per kind
    shared by the models (HilaCAM and Anchor: one sequential scale; DiRe: one centred at 0), and the
    caption tree of P scored by each model. An upload smaller than half the display side is
    upscaled nearest-neighbour (its pixels stay visible), a larger one smoothly."""
    from vlctl.methods.threevl.explain import explain_maps
    from vlctl.report.overlays import ColourScale, overlay_rgb

    t0 = time.perf_counter()
    if pixels is None:
        es.check_row(row)
        image, pixelated = np.ascontiguousarray(es.pixels(row)), es.pixelated
    else:
        image, pixelated = np.ascontiguousarray(pixels), max(pixels.shape[:2]) < DISPLAY_SIDE // 2
    results = {}
    with es.lock:  # HilaCAM backpropagates through the shared models
        for name, enc in es.models.items():
            results[name] = explain_maps(enc, image, positive, negative)
    seq_maps = [r["maps"][m] for r in results.values() for m in ("hilacam_positive", "hilacam_negative", "anchor")
                if m in r["maps"]]
    who = " and ".join(results)
    seq = ColourScale.sequential(seq_maps, f"HilaCAM relevancy, one scale for the P, N and Anchor maps of {who}")
    div = ColourScale.diverging([r["maps"]["dire"] for r in results.values() if "dire" in r["maps"]] or
                                [np.zeros(1)], f"DiRe, one scale for {who}: red = more relevant to P, blue = to N")
    shown = next(iter(results.values()))["shown"]
    h, w = shown.shape[:2]
    s = DISPLAY_SIDE / max(h, w)
    size = (max(1, round(h * s)), max(1, round(w * s)))
    levels, tree_note = None, ""
    if tree and es.trees is not None:
        try:
            with es.tree_lock:
                levels = es.trees.tree(positive)
        except VlctlError as e:
            tree_note = f"no caption tree: {e}"
    models = []
    for name, r in results.items():
        heat = []
        for key, title in METHODS:
            if key in r["maps"]:
                scale = div if key == "dire" else seq
                rgb = overlay_rgb(r["shown"], r["maps"][key], scale, r["region"], size=size, pixelated=pixelated)
                heat.append({"method": key, "title": title, "image": imaging.data_url(imaging.png(rgb))})
        tree_rows = None
        if levels is not None:
            try:
                with es.lock:
                    tree_rows = _tree_scores(es.models[name], image, levels)
            except VlctlError as e:
                tree_note = f"caption tree not scored: {e}"
        models.append({"model": name, "encoder_id": str(r["encoder_id"]), "positive_score": float(r["positive_score"]),
                       "negative_score": r.get("negative_score"), "anchor_text": r.get("anchor_text"),
                       "heatmaps": heat, "tree": tree_rows})
    bars = [{"method": "hilacam", "label": seq.label, "vmin": seq.vmin, "vmax": seq.vmax,
             "image": imaging.data_url(imaging.colour_bar(seq))}]
    if negative is not None:
        bars.append({"method": "dire", "label": div.label, "vmin": div.vmin, "vmax": div.vmax,
                     "image": imaging.data_url(imaging.colour_bar(div))})
    plain = overlay_rgb(shown, None, size=size, pixelated=pixelated)
    return {"image_id": row, "positive": positive, "negative": negative, "image": imaging.data_url(imaging.png(plain)),
            "models": models, "colour_bars": bars, "seconds": time.perf_counter() - t0, "tree_note": tree_note}
