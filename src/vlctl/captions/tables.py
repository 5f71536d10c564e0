"""The curated word tables of 3VL's one-word hard negatives (docs/methods.md §3.1): which word
may replace which, by part of speech, and the word lists the caption reader consults (compounds,
fixed phrases, quantity and picture nouns, what only people and animals can be or do).

Within a group every word is a plausible, false replacement for the others. `POS_TABLES` (by
`pos_table`) is what the tree generator uses; `OPPOSITES` is the English word list of the first
table, kept for callers that give no part of speech.
"""

from __future__ import annotations

from collections.abc import Mapping

from vlctl.captions.prepositions import RELATION_PHRASES

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
# Forms of "be" that spaCy tags VERB ("there is a dog"): no visual content to negate.
_COPULA = frozenset({"be", "is", "are", "was", "were", "been", "being", "am"})


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
