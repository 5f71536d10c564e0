"""The words of 3VL's one-word hard negatives (docs/methods.md §3.1): how a replacement word is
chosen: the stages, the hash that picks within a stage, the filter on candidates.

A negative changes exactly one NOUN / ADJ / ADP / VERB token of a text and keeps every other
character (`vlctl.captions.trees.TreeGenerator` picks the tokens). The replacement word is the
first non-empty stage of:

    table        the domain table given by the user, then the curated table below
                 (colours -> other colours, big/small, left/right, on/under, standing/sitting, ...)
    antonym      WordNet antonyms (direct, then via the adjective cluster head)
    co_hyponym   WordNet sisters of the first sense (hyponyms of its first hypernym)
    mlm          an optional masked-LM callable (tokens, index) -> [words]; none by default
    closed_class another adposition / a common visual adjective (3VL's "random adposition or
                 adjective" for the words WordNet has nothing for)

within a stage, a hash of (seed, caption, token index) picks the candidate (sha256, so trees are
the same in every process). Plural nouns get a plural replacement and verbs keep their -ing /
-s / -ed form, by simple rules (`pluralize`, `inflect_verb`).
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Any

from vlctl.captions import wordnet as wnmod
from vlctl.captions.tables import EXCLUDED_PAIRS

STAGES = ("table", "antonym", "co_hyponym", "mlm", "closed_class")
_WORD = re.compile(r"^[a-z]+$")
_ALNUM = re.compile(r"\w+")
# The lowest Zipf frequency (wordfreq, log10 of occurrences per billion words) a replacement may
# have: below it words are ones a reader stops at ("hydride" 2.5, "dicot" 1.9; "giraffe" 3.4).
# Measured with experiments/trees_quality.py (docs: issue 21).
MIN_ZIPF = 3.0


@functools.lru_cache(maxsize=200_000)
def zipf(word: str) -> float:
    """wordfreq's Zipf frequency of an English word or phrase (0 when unknown)."""
    from wordfreq import zipf_frequency

    return zipf_frequency(word, "en")


_PHRASE = re.compile(r"^[a-z]+( [a-z]+)?$")  # a replacement: one or two lowercase words


def keep_candidates(wn, words, lower: str, base: str, pos: str, min_zipf: float, domain: bool = False) -> tuple[str, ...]:
    """The replacement words a negative may use for `lower` (base form `base`): one or two plain words,
    not the word itself nor an EXCLUDED_PAIRS partner; but for a domain table's words (taken as they
    are) also not related in WordNet (`wordnet.is_related`) nor rarer than Zipf `min_zipf`."""
    out = []
    for w in words:
        if w in (lower, base) or not _PHRASE.match(w) or (base, w) in EXCLUDED_PAIRS:
            continue
        if not domain:
            if wn is not None and pos in wnmod.WN_POS and (
                    wnmod.is_related(wn, base, w, pos) or wnmod.is_related(wn, lower, w, pos)):
                continue
            if zipf(w) < min_zipf:
                continue
        out.append(w)
    return tuple(dict.fromkeys(out))


def _hash_int(*parts: Any) -> int:
    """A process-independent integer from the parts (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode("utf-8")).digest()[:8], "big")


def caption_hash(caption: str) -> str:
    return hashlib.sha256(caption.encode("utf-8")).hexdigest()
