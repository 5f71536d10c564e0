"""What an SAE learned: every latent named with text, its top images, and a check of each name.

A CLIP SAE's decoder row W_D[r] is a direction in the joint image-text space, so the texts nearest
it name it (issue 46). The pieces, each a pure function over arrays:

- The vocabulary. `mentions(text)` is the set of phrases (1 to 3 words, within one clause, not
  starting or ending with a function word) a caption mentions; a phrase right after a negation
  ("no", "not", "without") is not mentioned ("no swelling" mentions "no swelling", not
  "swelling"). `caption_vocabulary` keeps the phrases mentioned by at least `min_count` captions.
- The names. `nearest_names`: cosine of each decoder row with each name's text embedding, the
  text embeddings centred on their mean first. CLIP puts every text on a large common offset
  (the modality gap) that no image direction has; a learned SAE's rows are image directions
  around b_pre, a CG-SAE's rows are centred text embeddings, so only what distinguishes one name
  from another is compared. Each name comes with its cosine and its margin over the next name.
- The codes. `encode_codes` streams the image rows through the SAE in chunks and keeps only the
  TopK codes as COO triples: memory is O(n k), never the dense (n, n_latents) matrix.
- The check. `pair_auc`: the ROC AUC of latent r's activation for "the image's caption mentions
  name s", for chosen (r, s) pairs, exact (ties counted one half), from the sparse codes: an image
  where r does not fire scores 0, so those n - nnz_r images share one average rank and only the
  firing images are ranked one by one.
- The control. The same names and AUCs with the decoder rows permuted among the live latents
  (`describe_codes(..., shuffle_seed)`): a latent then carries another latent's names, so its AUC
  shows what a name check gives by chance on this data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from vlctl.fsops import VlctlError
from vlctl.methods.base import as_tensor

NEGATIONS = frozenset({"no", "not", "without", "non", "never", "nor"})
# Function words a phrase may not start or end with ("the dog" is "dog"); a phrase may start with a
# negation ("no swelling" is something one can see), never end with one.
STOPWORDS = frozenset(["a", "an", "the", "of", "in", "on", "at", "to", "for", "from", "by", "with", "and", "or", "but", "is", "are", "was", "were", "be", "been", "being", "it", "its", "this", "that", "these", "those", "there", "here", "as", "into", "onto", "over", "under", "near", "next", "up", "down", "out", "off", "some", "any", "each", "his", "her", "their", "our", "your", "my", "one", "two", "three", "very", "has", "have", "had", "do", "does", "did", "while", "who", "which", "what"])
MAX_PHRASE = 3  # words of a caption phrase
_CLAUSE = re.compile(r"\s+[-\u2013\u2014]+\s+|[,.;:!?()\[\]{}\"|/]")  # "thinning - 7 - red" is 3 clauses
_WORD = re.compile(r"[^\W_]+(?:['\-][^\W_]+)*")  # words, "t-shirt" and "dog's" whole
VISUAL_WORDS = Path(__file__).with_name("visual_words.txt")


def words(text: str) -> list[list[str]]:
    """`text` as clauses of lower-case words (`_CLAUSE` splits, `_WORD` finds the words)."""
    return [ws for clause in _CLAUSE.split(text.lower()) if (ws := _WORD.findall(clause))]


def normalise(name: str) -> str:
    """A name as captions are matched against it: its words, lower case, one space apart."""
    return " ".join(w for clause in words(name) for w in clause)


def mentions(text: str, max_len: int = MAX_PHRASE, vocabulary: Iterable[str] | None = None) -> set[str]:
    """The phrases `text` mentions: runs of 1..max_len words inside one clause, not preceded by a
    negation unless the phrase is the negation's own ("no swelling"). With `vocabulary` (normalised
    names), any run that is one of them; without it, only runs that neither start with a function
    word nor end with a function word or a negation (the candidates of `caption_vocabulary`)."""
    keep = None if vocabulary is None else set(vocabulary)
    out: set[str] = set()
    for ws in words(text):
        for i in range(len(ws)):
            if i and ws[i - 1] in NEGATIONS and ws[i] not in NEGATIONS:
                continue  # negated: "no swelling" does not mention "swelling"
            for j in range(i + 1, min(len(ws), i + max_len) + 1):
                phrase = " ".join(ws[i:j])
                if keep is not None:
                    if phrase in keep:
                        out.add(phrase)
                elif ws[i] not in STOPWORDS and ws[j - 1] not in STOPWORDS and ws[j - 1] not in NEGATIONS:
                    out.add(phrase)
    return out


def caption_vocabulary(captions: Iterable[str], min_count: int = 2, max_size: int = 5000) -> list[str]:
    """The phrases (`mentions`) of at least `min_count` captions, the `max_size` most frequent,
    most frequent first (ties alphabetical)."""
    counts = Counter(p for c in captions for p in mentions(c))
    ranked = sorted((p for p, n in counts.items() if n >= min_count), key=lambda p: (-counts[p], p))
    return ranked[:max_size]


def read_vocabulary(path: str | Path) -> list[str]:
    """A vocabulary file: one name per line, UTF-8; blank lines and lines starting with # skipped."""
    from vlctl.io import read_text_utf8

    names = [ln.strip() for ln in read_text_utf8(path, "vocabulary file").splitlines()]
    return [n for n in names if n and not n.startswith("#")]


def merge_vocabulary(*lists: Sequence[str]) -> list[str]:
    """The names of every list in order, the first of each normalised form kept; names with no word
    (punctuation only) dropped."""
    seen: set[str] = set()
    out = []
    for names in lists:
        for n in names:
            key = normalise(n)
            if key and key not in seen:
                seen.add(key)
                out.append(n)
    return out


# --- names -------------------------------------------------------------------------------------


def nearest_names(decoder: np.ndarray, name_emb: np.ndarray, n: int = 5, block: int = 1024) -> tuple[np.ndarray,
                                                                                                      np.ndarray]:
    """The n names nearest each decoder row: (indices (d1, n), cosines (d1, n)), nearest first.

    cosine[r, j] = cos(W_D[r], t_j - mean_j t_j) with t the (V, d) name embeddings: centred on the
    vocabulary's mean (module docstring). n is capped at V. Rows are done `block` at a time, so the
    (d1, V) cosine matrix is never whole.
    """
    d = np.asarray(decoder, dtype=np.float32)
    t = np.asarray(name_emb, dtype=np.float32)
    if t.ndim != 2 or len(t) == 0:
        raise VlctlError("the vocabulary is empty: no name to give the latents")
    if t.shape[1] != d.shape[1]:
        raise VlctlError(f"name embeddings have dimension {t.shape[1]}, the SAE's decoder {d.shape[1]}")
    t = t - t.mean(0) if len(t) > 1 else t
    t = t / np.maximum(np.linalg.norm(t, axis=1, keepdims=True), 1e-12)
    d = d / np.maximum(np.linalg.norm(d, axis=1, keepdims=True), 1e-12)
    n = min(n, len(t))
    idx = np.empty((len(d), n), np.int64)
    cos = np.empty((len(d), n), np.float32)
    for a in range(0, len(d), block):
        c = d[a:a + block] @ t.T
        top = np.argpartition(-c, n - 1, axis=1)[:, :n] if n < c.shape[1] else np.broadcast_to(
            np.arange(c.shape[1]), c.shape)
        val = np.take_along_axis(c, top, 1)
        order = np.lexsort((top, -val), axis=1)  # nearest first, ties by vocabulary order
        idx[a:a + block] = np.take_along_axis(top, order, 1)
        cos[a:a + block] = np.take_along_axis(val, order, 1)
    return idx, cos


# --- codes -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Codes:
    """The nonzero SAE codes of n_rows images as COO triples (activation > 0 only)."""

    rows: np.ndarray  # (nnz,) int64 image row
    latents: np.ndarray  # (nnz,) int64 latent
    values: np.ndarray  # (nnz,) float32 activation
    n_rows: int
    n_latents: int

    def counts(self) -> np.ndarray:
        """(n_latents,) how many images each latent fires on."""
        return np.bincount(self.latents, minlength=self.n_latents)

    def sums(self) -> np.ndarray:
        """(n_latents,) the sum of each latent's activations."""
        return np.bincount(self.latents, weights=self.values, minlength=self.n_latents)

    def top_rows(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows (n_latents, k), values (n_latents, k)) of each latent's k largest activations,
        largest first (ties: lower row first); -1 / 0 pad a latent firing on fewer than k images."""
        order = np.lexsort((self.rows, -self.values, self.latents))
        lat = self.latents[order]
        starts = np.searchsorted(lat, np.arange(self.n_latents))
        pos = np.arange(len(order)) - starts[lat]  # rank within the latent
        keep = pos < k
        rows = np.full((self.n_latents, k), -1, np.int64)
        vals = np.zeros((self.n_latents, k), np.float32)
        rows[lat[keep], pos[keep]] = self.rows[order][keep]
        vals[lat[keep], pos[keep]] = self.values[order][keep]
        return rows, vals


def chunk_rows(n_latents: int, budget: int = 1 << 25) -> int:
    """Image rows encoded at once: the (rows, n_latents) float32 pre-activations stay near 128 MiB."""
    return int(min(65536, max(64, budget // max(1, n_latents))))


@torch.no_grad()
def encode_codes(model, chunks: Iterable[np.ndarray], n_rows: int, step: Callable[[int], None] | None = None) -> Codes:
    """Stream (m, d) chunks of image embeddings through a `TopKSAE` -> their nonzero codes.

    The codes are `model.encode`'s, kept as `model.encode_topk` gives them (no dense (m, d1)
    output). `step(m)` after each chunk (a progress bar's update)."""
    rows, lats, vals = [], [], []
    start = 0
    for x in chunks:
        idx, v = (t.numpy() for t in model.encode_topk(as_tensor(np.asarray(x, dtype=np.float32))))
        r, c = np.nonzero(v > 0)
        rows.append(r.astype(np.int64) + start)
        lats.append(idx[r, c].astype(np.int64))
        vals.append(v[r, c])
        start += len(v)
        if step is not None:
            step(len(v))
    if start != n_rows:
        raise VlctlError(f"encode_codes: {start} rows streamed, {n_rows} expected")
    cat = (lambda parts, dt: np.concatenate(parts) if parts else np.zeros(0, dt))
    return Codes(cat(rows, np.int64), cat(lats, np.int64), cat(vals, np.float32), n_rows, int(model.W_D.shape[0]))


# --- the check -----------------------------------------------------------------------------------


def mention_matrix(texts: Sequence[str], image_of_text: np.ndarray, names: Sequence[str], n_images: int) -> sp.csr_matrix:
    """(n_images, len(names)) bool: some caption of the image mentions the name (`mentions`)."""
    keys = [normalise(n) for n in names]
    col = {k: j for j, k in enumerate(keys)}
    max_len = max((len(k.split()) for k in keys), default=1)
    rows, cols = [], []
    for t, img in zip(texts, image_of_text):
        for p in mentions(t, max_len, col):
            rows.append(int(img))
            cols.append(col[p])
    m = sp.csr_matrix((np.ones(len(rows), bool), (rows, cols)), shape=(n_images, len(names)), dtype=bool)
    m.sum_duplicates()  # an image with two captions mentioning a name is one positive
    return m


def within_latent_ranks(codes: Codes) -> np.ndarray:
    """(nnz,) the 1-based rank of each code among its latent's nonzero activations, ascending, tied
    activations given their average rank."""
    order = np.lexsort((codes.values, codes.latents))
    lat, val = codes.latents[order], codes.values[order]
    n = len(order)
    new_run = np.ones(n, bool)
    new_run[1:] = (lat[1:] != lat[:-1]) | (val[1:] != val[:-1])
    run_start = np.flatnonzero(new_run)
    run_end = np.append(run_start[1:], n)  # exclusive
    group_start = np.searchsorted(lat, lat[run_start])  # the latent's first position
    avg = (run_start + run_end + 1) / 2.0 - group_start  # mean of positions start+1..end, 1-based in the latent
    ranks = np.empty(n, np.float64)
    ranks[order] = np.repeat(avg, run_end - run_start)
    return ranks


def pair_auc(codes: Codes, positives: sp.csr_matrix, latent: np.ndarray, name: np.ndarray,
             block: int = 2048) -> np.ndarray:
    """ROC AUC (in [0, 1]) of latent[j]'s activation for positives[:, name[j]], for each pair j;
    NaN where the name has no positive or no negative image.

    AUC = (R_pos - P (P + 1) / 2) / (P N), R_pos the sum of the positives' ranks among all n images
    (ascending, ties averaged), P positives, N = n - P negatives: the Mann-Whitney U, equal to
    sklearn.metrics.roc_auc_score. The n0 = n - nnz_r images where latent r does not fire all
    score 0 and share the rank (n0 + 1) / 2; a firing image's rank is n0 + its rank among the
    firing ones. So R_pos = (P - a)(n0 + 1) / 2 + a n0 + q, with a the positives among the firing
    images and q the sum of their within-latent ranks: two sparse products, `block` latents at a time.
    """
    n = codes.n_rows
    latent, name = np.asarray(latent, np.int64), np.asarray(name, np.int64)
    ranks = within_latent_ranks(codes)
    fired = sp.csr_matrix((np.ones(len(ranks)), (codes.latents, codes.rows)), shape=(codes.n_latents, n))
    ranked = sp.csr_matrix((ranks, (codes.latents, codes.rows)), shape=(codes.n_latents, n))
    pos = positives.astype(np.float64).tocsc()
    a = np.zeros(len(latent))
    q = np.zeros(len(latent))
    for b in range(0, codes.n_latents, block):
        sel = np.flatnonzero((latent >= b) & (latent < b + block))
        if not len(sel):
            continue
        cols = np.unique(name[sel])
        p_block = pos[:, cols]  # only the names asked about: (n, c)
        where = np.searchsorted(cols, name[sel])
        # The products stay sparse ((block, c) at most); only the asked-for entries are read out.
        a[sel] = np.asarray((fired[b:b + block] @ p_block).tocsr()[latent[sel] - b, where]).ravel()
        q[sel] = np.asarray((ranked[b:b + block] @ p_block).tocsr()[latent[sel] - b, where]).ravel()
    n_pos = np.asarray(positives.sum(0)).ravel().astype(np.float64)[name]
    n_neg = n - n_pos
    n0 = n - codes.counts()[latent].astype(np.float64)
    r_pos = (n_pos - a) * (n0 + 1) / 2 + a * n0 + q
    with np.errstate(invalid="ignore", divide="ignore"):
        auc = (r_pos - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    return np.where((n_pos > 0) & (n_neg > 0), auc, np.nan)


# --- the table -------------------------------------------------------------------------------------


def shuffled_rows(n_latents: int, live: np.ndarray, seed: int = 0) -> np.ndarray:
    """(n_latents,) a permutation that moves each live latent's decoder row to another live latent
    (a seeded shuffle among the live ones; the dead keep theirs): the control's decoder."""
    perm = np.arange(n_latents)
    idx = np.flatnonzero(live)
    perm[idx] = idx[np.random.default_rng(seed).permutation(len(idx))]
    return perm


@dataclasses.dataclass
class Description:
    """`describe_codes`' result: `rows` one dict per latent (the table of latents.jsonl), `summary`
    the headline and its shuffled-decoder control."""

    rows: list[dict]
    summary: dict


GOOD_AUC = 0.95  # a name "checks out" when its AUC reaches this (issue 46's target for the CG-SAE)


def _auc_summary(auc: np.ndarray) -> dict:
    """The top names' AUCs of the live latents summarised: how many could be checked, their mean and
    median, and the share reaching GOOD_AUC."""
    ok = auc[np.isfinite(auc)]
    return {"checked": len(ok), "auc_mean": float(ok.mean()) if len(ok) else None,
            "auc_median": float(np.median(ok)) if len(ok) else None,
            f"share_auc_ge_{GOOD_AUC}": float((ok >= GOOD_AUC).mean()) if len(ok) else None}


def describe_codes(codes: Codes, decoder: np.ndarray, names: Sequence[str], name_emb: np.ndarray,
                   positives: sp.csr_matrix | None = None, k: int = 16, n_names: int = 5,
                   shuffle_seed: int = 0) -> Description:
    """The table of latents from the codes of a store's images and the named decoder rows.

    Each row: latent, live (fires on some image), frequency (share of the images it fires on),
    mean_activation (its mean over the images it fires on; 0 when dead), top_images / top_values
    (its k largest activations, largest first), names (the n_names nearest, each with its cosine,
    its margin over the next name, and, with `positives` (n_images, V) from captions, the AUC of
    the latent's activation for the images mentioning it; dead latents get names but no AUC).
    The summary holds the counts, the top names' AUCs of the live latents, and the same for the
    shuffled-decoder control (`shuffled_rows`)."""
    counts = codes.counts()
    live = counts > 0
    freq = counts / max(codes.n_rows, 1)
    mean_act = np.divide(codes.sums(), counts, out=np.zeros(codes.n_latents), where=live)
    idx, cos = nearest_names(decoder, name_emb, n_names + 1)
    # the margin over the next name; the last name of the vocabulary has none
    margin = np.concatenate([cos[:, :-1] - cos[:, 1:], np.full((len(cos), 1), np.nan, np.float32)], axis=1)
    m = min(n_names, idx.shape[1])
    idx, cos, margin = idx[:, :m], cos[:, :m], margin[:, :m]
    top_rows, top_vals = codes.top_rows(k)
    auc = np.full(idx.shape, np.nan)
    summary = {"n_images": codes.n_rows, "n_latents": codes.n_latents, "live": int(live.sum()),
               "dead": int((~live).sum()), "vocabulary": len(names), "k": k}
    if positives is not None and live.any():
        lat = np.repeat(np.flatnonzero(live), m)
        auc[live] = pair_auc(codes, positives, lat, idx[live].ravel()).reshape(-1, m)
        perm = shuffled_rows(codes.n_latents, live, shuffle_seed)
        ctrl_idx, _ = nearest_names(decoder[perm[live]], name_emb, 1)
        ctrl = pair_auc(codes, positives, np.flatnonzero(live), ctrl_idx[:, 0])
        summary["top_name"] = _auc_summary(auc[live, 0])
        summary["shuffled_decoder"] = {"seed": shuffle_seed, **_auc_summary(ctrl)}
    rows = []
    for r in range(codes.n_latents):
        got = top_rows[r] >= 0
        rows.append({
            "latent": r, "live": bool(live[r]), "frequency": float(freq[r]), "mean_activation": float(mean_act[r]),
            "names": [{"name": names[idx[r, j]], "cosine": float(cos[r, j]),
                       "margin": None if np.isnan(margin[r, j]) else float(margin[r, j]),
                       "auc": None if np.isnan(auc[r, j]) else float(auc[r, j])} for j in range(m)],
            "top_images": top_rows[r][got].tolist(), "top_values": top_vals[r][got].tolist()})
    return Description(rows, summary)


# --- a store ---------------------------------------------------------------------------------------


def store_vocabulary(store, extra: Sequence[str] = (), min_count: int = 2, max_size: int = 5000) -> tuple[list[str],
                                                                                                          str]:
    """(names, where they came from): the store's caption phrases (`caption_vocabulary`), or the
    shipped visual words (VISUAL_WORDS) when the store has no captions, then `extra`."""
    captions = store.texts
    if captions:
        base, source = caption_vocabulary(captions, min_count, max_size), "captions"
    else:
        base, source = read_vocabulary(VISUAL_WORDS), "visual words"
    names = merge_vocabulary(base, extra)
    if not names:
        raise VlctlError(f"{store.path}: the vocabulary is empty ({source} gave no name"
                         + (f" mentioned by {min_count} captions" if captions else "") + " and no --vocabulary was given)")
    return names, source + (" + vocabulary file" if extra else "")


def store_encoder(store, encoder=None):
    """The encoder that embeds the vocabulary: `encoder`, else the one the store's spec rebuilds;
    either must be the store's (an encoder of another space names nothing)."""
    if encoder is None:
        if not store.encoder_spec:
            raise VlctlError(f"{store.path}: the store records no encoder spec, so the vocabulary cannot be embedded "
                             "in its space (pass the encoder)")
        from vlctl.encoders.factory import load_encoder

        encoder = load_encoder(store.encoder_spec)
    store.check_encoder(encoder.id)
    return encoder


def embed_names(encoder, names: list[str]) -> tuple[list[str], np.ndarray, list[str]]:
    """(names, their embeddings, the names dropped): a name the encoder's tokenizer refuses (a
    closed-vocabulary TinyCLIP knows only its own words) is dropped, not an error; none left is one."""
    from vlctl.fsops import VlctlError as Refused

    try:
        return names, encoder.embed_texts(names), []
    except Refused:
        pass

    def ok(name: str) -> bool:
        try:
            encoder.tokenize([name])
            return True
        except Refused:
            return False

    keep = [n for n in names if ok(n)]
    if not keep:
        raise VlctlError(f"the vocabulary is empty: the encoder's tokenizer refuses all {len(names)} names "
                         f"(e.g. {names[0]!r})")
    return keep, encoder.embed_texts(keep), [n for n in names if n not in set(keep)]


def describe_store(model, encoder_id: str, store, vocabulary: Sequence[str] = (), encoder=None, k: int = 16,
                   n_names: int = 5, min_count: int = 2, max_vocabulary: int = 5000, shuffle_seed: int = 0,
                   progress: bool = False) -> Description:
    """`describe_codes` over a store: its image rows streamed through the SAE `model` (fitted on
    `encoder_id`), named with the store's vocabulary (`store_vocabulary`, plus `vocabulary`) embedded
    by its encoder, checked against its captions."""
    from vlctl.progress import heartbeat, progress_bar

    store.check_encoder(encoder_id)
    if not len(store):  # (not `image_emb`, which reads every row)
        raise VlctlError(f"{store.path}: the store holds no image embeddings")
    names, source = store_vocabulary(store, vocabulary, min_count, max_vocabulary)
    encoder = store_encoder(store, encoder)
    names, name_emb, dropped = embed_names(encoder, names)
    n = len(store)
    with progress_bar(total=n, desc="inspect sae: encoding images", unit="img", disable=not progress) as bar:
        codes = encode_codes(model, store.images_table.chunks(chunk_rows(int(model.W_D.shape[0]))), n, bar.update)
    # The rest has no counter of its own: a line every 30 s says it is running.
    with heartbeat("inspect sae: names, top images and AUCs") if progress else contextlib.nullcontext():
        positives = None
        if store.texts:
            positives = mention_matrix(store.texts, store.image_of_text(), names, n)
        desc = describe_codes(codes, model.W_D.detach().numpy(), names, name_emb, positives, k, n_names, shuffle_seed)
    desc.summary.update(vocabulary_source=source, vocabulary_dropped=dropped)
    return desc


def active_names(model, x: np.ndarray, latent_names: Sequence[str | None] | None) -> list[dict]:
    """The latents active in one embedding x (d,): [{latent, value, name}], largest value first;
    name from `latent_names` (one per latent), None without it."""
    codes = encode_codes(model, [np.asarray(x, np.float32).reshape(1, -1)], 1)
    order = np.argsort(-codes.values, kind="stable")
    return [{"latent": int(codes.latents[i]), "value": float(codes.values[i]),
             "name": None if latent_names is None else latent_names[codes.latents[i]]} for i in order]


def decoder_names(model, store, encoder=None, vocabulary: Sequence[str] = (), min_count: int = 2,
                  max_vocabulary: int = 5000) -> list[str]:
    """Each latent's top name (`nearest_names`) from the store's vocabulary, without encoding its
    images: what `--explain` prints beside a latent."""
    names, _ = store_vocabulary(store, vocabulary, min_count, max_vocabulary)
    names, name_emb, _ = embed_names(store_encoder(store, encoder), names)
    idx, _ = nearest_names(model.W_D.detach().numpy(), name_emb, 1)
    return [names[i] for i in idx[:, 0]]
