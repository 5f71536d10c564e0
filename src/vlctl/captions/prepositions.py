"""Prepositions of the 3VL caption-tree negatives (docs/methods.md §3.1, issue 21): the contrast of
each preposition by the kind of its object, the relation phrases replaced whole, the verbs whose
preposition names what they act on, and the objects that allow no false contrast.

`object_kind` (the kind of a preposition's object: garment, thing, place) and `in_kind` (seventh
round: what one can be outside of, beside or near) read WordNet; `vlctl.captions.parse`
decides from them which preposition of a caption gets a negative, and `vlctl.captions.trees` picks
the contrast from ADP_CONTRASTS.
"""

from __future__ import annotations

import functools

from vlctl.captions.wordnet import base_form, most_frequent_sense

# Prepositions: a contrast that keeps the sentence grammatical and makes it false. The object's
# kind decides ("on a table" -> "under a table", but "on the beach" -> "near the beach").
# key: (preposition, object kind) with kind "thing" (an artifact, food, animal, person, plant),
# "garment" (clothing) or "place" (anything else); "*" for any kind. The object of "in" has kinds of
# its own (`in_kind`); their order here keeps the closed-domain list of every contrast of "in" (trees) as it was.
ADP_CONTRASTS: dict[tuple[str, str], tuple[str, ...]] = {
    ("on", "thing"): ("under", "beside"), ("on", "place"): ("near",), ("on", "garment"): ("under",),
    ("at", "place"): ("near",),  # "people at the beach" -> "near the beach" (a thing's "at a table": none)
    ("in", "thing"): ("beside", "outside"), ("in", "place"): ("near",), ("in", "garment"): ("without",),
    # "in" by `in_kind` (seventh round): "outside the stadium", "beside an orange chair" (never "outside"
    # it), "beside a napkin"; regions, bodies of water and what WordNet does not know get none
    ("in", "enclosure"): ("outside",), ("in", "furniture"): ("beside",), ("in", "object"): ("beside",),
    ("near", "thing"): ("on",), ("near", "place"): ("in",), ("near", "garment"): ("on",),
    ("under", "*"): ("on", "beside"), ("under", "overhead"): ("beside",), ("underneath", "*"): ("above",),
    ("beneath", "*"): ("above",),
    # what one sits, stands or lies on ("a man sitting on a bench" -> "under a bench" is absurd)
    ("on", "support"): ("beside",), ("on", "animate"): ("beside",), ("near", "animate"): ("behind",),
    ("by", "animate"): ("behind",),
    # "a dog by a car" -> "behind a car" (a thing; "by the ocean" has no one-word contrast)
    ("by", "thing"): ("behind",),
    ("above", "*"): ("below",), ("below", "*"): ("above",), ("over", "*"): ("under",),
    ("behind", "*"): ("beside",), ("beside", "*"): ("behind",),
    ("inside", "*"): ("outside",), ("outside", "*"): ("inside",), ("within", "*"): ("outside",),
    ("with", "*"): ("without",), ("without", "*"): ("with",),
    ("onto", "*"): ("off",), ("off", "*"): ("onto",), ("before", "*"): ("after",), ("after", "*"): ("before",),
    # (no up/down, across/along: "riding down the street" -> "up the street" is not false in a photo)
}
# Relation phrases replaced whole (fourth round) by one that differs in one word (a negative changes one
# word): "in front of a bus" -> "in back of a bus", "inside of a box" -> "outside of a box".
RELATION_PHRASES = {"in front of": {"*": ("in back of",)}, "inside of": {"*": ("outside of",)},
                    "at the top of": {"*": ("at the bottom of",)}, "at the bottom of": {"*": ("at the top of",)},
                    "on the back of": {"*": ("on the front of",)}, "on the front of": {"*": ("on the back of",)},
                    "in the back of": {"*": ("in the front of",)}, "in the front of": {"*": ("in the back of",)},
                    "in the middle of": {"*": ("in the corner of",), "road": ()},  # (a road has no corner)
                    "in the corner of": {"*": ("in the middle of",)}, "to the left of": {"*": ("to the right of",)},
                    "to the right of": {"*": ("to the left of",)}}
ADP_REPLACED = frozenset(p for p, _ in ADP_CONTRASTS)
# Verb + preposition of what the verb acts on, not a place: "engaging in a sport", "talking on a phone".
_ARGUMENT_IN = ("engage", "participate", "dress", "wrap", "coat", "dip", "soak", "involve", "interest", "clad", "cut",
                "break", "slice", "arrange", "decorate", "bundle", "cover", "fill", "write", "paint",
                "print", "lean")
_ARGUMENT_ON = ("put", "place", "set", "pull", "grind", "spread", "pour", "sprinkle", "drizzle", "write", "draw",
                "paint", "print", "press", "tap", "knock", "type", "talk", "chat", "work", "try",
                "pin", "stick", "post", "display", "feature", "depict", "show", "spray", "smear",
                "splash", "rub", "pile", "stack", "load", "hang")
_ARGUMENT_AT = ("look", "stare", "gaze", "glance", "point", "smile", "laugh", "aim", "wave", "bark", "throw", "swing",
                "shout", "yell", "peer", "peek", "work", "arrive", "stop", "play", "sit", "eat", "lick", "bite", "peck",
                "grab", "paw", "nibble")
VERB_ARGUMENT_ADP = frozenset({*((v, "in") for v in _ARGUMENT_IN), *((v, "on") for v in _ARGUMENT_ON),
                               *((v, "at") for v in _ARGUMENT_AT)})

# Objects a thing is trivially "near" when it is on or in them ("on the ground" -> "near the
# ground" stays true): no near/in swap for these.
NO_NEAR_OBJECTS = frozenset({"ground", "floor", "corner", "sky", "air", "side", "edge", "surface", "street",
                             "sidewalk", "road", "top", "bottom", "middle", "background", "foreground", "distance"})
# Preposition objects with no false contrast a reader accepts (issue 21): ground cover and weather
# one is in or on ("skiing in the snow" -> "near the snow", "in the sands" -> "near the sands"),
# besides WordNet's weather/phenomenon nouns and body parts ("in his hand" -> "outside his hand");
# pronoun objects ("on it" -> "under it") are skipped too (caption_parse.skip_reason).
GROUND_COVER_OBJECTS = frozenset({"snow", "sand", "sands", "dirt", "mud", "grass", "gravel", "ice", "rain", "sun",
                                  "sunshine", "sunlight", "shade", "shadow", "shadows", "wind", "fog", "mist", "dark",
                                  "darkness", "light", "hay", "dust", "smoke", "weather", "sunset", "daylight"})
NO_CONTRAST_OBJECT_LEXNAMES = frozenset({"noun.body", "noun.phenomenon"})
# Objects one is "under" from below (shelter): "under a pink umbrella" -> "on a pink umbrella" is
# absurd, so only "beside" (ADP_CONTRASTS kind "overhead").
OVERHEAD_OBJECTS = frozenset({"umbrella", "umbrellas", "tree", "trees", "bridge", "awning", "canopy", "tent", "roof",
                              "sky", "clouds", "cloud", "parasol", "overpass", "ceiling", "arch", "archway",
                              "shelter", "kite", "kites"})
# Preposition objects one is in, with no false contrast: arrangements ("in a line", "in a circle").
ARRANGEMENT_OBJECTS = frozenset({"line", "lines", "row", "rows", "circle", "circles", "file", "formation",
                                 "pile", "piles", "stack", "stacks", "heap", "cluster", "queue", "column", "columns"})
# Directions and surfaces one hangs on (fifth round): "in the opposite direction" -> "near the opposite
# direction"; "a crucifix on the wall" -> "near the wall" stays true; verbs done on a board or vehicle.
ORIENTATION_NOUNS = frozenset({"direction", "directions", "angle", "distance", "horizon", "way"})
VERTICAL_OBJECTS = frozenset({"wall", "walls", "fence", "fences", "door", "doors", "window", "windows", "pole",
                              "poles", "post", "fridge", "refrigerator", "screen", "building", "billboard"})
RIDE_VERBS = frozenset({"ride", "surf", "skate", "skateboard", "ski", "snowboard", "sail", "paddle", "balance"})
# The air one flies or jumps through: no verb of it is swapped ("flying through the air" -> "walking").
AIR_OBJECTS = frozenset({"air", "sky", "skies", "midair"})
# Bare position nouns ("in front of", "on top of"), not phrases of their own.
POSITION_NOUNS = frozenset({"front", "top", "side", "middle", "back", "bottom", "edge", "corner", "end", "center"})
LOCATIVE_ADP = frozenset({"in", "on", "at", "near", "under", "by", "beside", "behind", "inside", "outside", "next",
                          "underneath", "beneath", "above", "below", "among", "between", "atop", "upon", "against",
                          "around", "along"})


_GARMENT_ROOTS = frozenset({"clothing.n.01", "garment.n.01", "headdress.n.01", "footwear.n.02", "accessory.n.01"})
_PLACE_LEXNAMES = frozenset({"noun.location", "noun.object", "noun.substance", "noun.phenomenon", "noun.time",
                             "noun.event", "noun.act", "noun.state"})


@functools.lru_cache(maxsize=50_000)
def object_kind(wn, base: str) -> str:
    """"garment", "thing" or "place" for a preposition's object noun (its most frequent sense):
    clothing ("in a red shirt"), an object one can be on, under or beside ("a table"), or a place
    or substance one is in or near ("a field", "the water"). "thing" when WordNet does not know it."""
    sense = most_frequent_sense(wn, base, "NOUN")
    if sense is None:
        return "thing"
    ancestors = {h.name() for h in sense.closure(lambda x: x.hypernyms())}
    if ancestors & _GARMENT_ROOTS:
        return "garment"
    if sense.lexname() in _PLACE_LEXNAMES or {"area.n.01", "geographic_point.n.01", "room.n.01",
                                             "structure.n.01", "region.n.03", "thoroughfare.n.01", "road.n.01",
                                             "body_of_water.n.01", "land.n.04"} & ancestors:
        return "place"
    return "thing"



# The object of "in" (seventh round, issue 21: "near" and "outside" were odd or still true for many):
# what one is inside of (rooms, buildings, tents, cages, stadiums, zoos) -> "outside" ("playing tennis
# outside the stadium" is clearly false; "near the kitchen" is not); containers and vehicles -> "beside"
# or "outside" ("donuts outside these boxes"); furniture and seats -> "beside" ("a kitty outside an
# orange chair" is odd); other artifacts, plants and food -> "beside"; substances -> "near" ("a man near
# the water"); regions, land, bodies of water, settings, abstractions and words WordNet lacks -> none
# ("zebras near a desert setting", "a wave near ocean", "a player outside mid-serve").
INSIDE_ROOTS = frozenset({"room.n.01", "building.n.01", "structure.n.01", "facility.n.01"})
CONTAINER_ROOTS = frozenset({"container.n.01", "conveyance.n.03"})
FURNITURE_ROOTS = frozenset({"furniture.n.01", "seat.n.03"})
_BESIDE_LEXNAMES = frozenset({"noun.artifact", "noun.plant", "noun.food"})
NO_IN_CONTRAST = "none"  # in_kind's kind of an object "in" has no false contrast for


def _ancestors(sense) -> set[str]:
    return {sense.name(), *(h.name() for h in sense.closure(lambda x: x.hypernyms()))}


def _garment(sense) -> bool:
    """A sense that is worn: clothing, glasses ("a man in sunglasses"), a part of clothing ("in heels")."""
    roots = _GARMENT_ROOTS | {"spectacles.n.01"}
    return bool(_ancestors(sense) & roots) or any(_ancestors(w) & roots for w in sense.part_holonyms())


@functools.lru_cache(maxsize=50_000)
def in_kind(wn, word: str) -> str:
    """The kind of the object noun `word` of "in" that picks its contrast (ADP_CONTRASTS): "garment",
    "furniture", "thing" (a container or vehicle), "enclosure", "place" (a substance), "object" or
    NO_IN_CONTRAST (see INSIDE_ROOTS above). By the most frequent sense, except that a word one of
    whose first two senses is a body part is a garment when one of its first three senses is one
    ("in heels" -> "without heels"), else it has no contrast ("in her lap"); and a word with a garment
    among its first three senses is one ("in a green jersey", where the first is New Jersey). A plural
    that is a lemma of its own is read as itself ("in the woods", "in shorts"), else as its singular."""
    own = any(lemma.name().lower() == word for s in wn.synsets(word, "n") for lemma in s.lemmas())
    base = word if own else base_form(wn, word, "NOUN")
    sense = most_frequent_sense(wn, base, "NOUN")
    if sense is None:
        return NO_IN_CONTRAST
    senses = wn.synsets(base, "n")[:3]
    if _garment(sense):
        return "garment"
    if any(s.lexname() == "noun.body" for s in senses[:2]):
        return "garment" if any(_garment(s) for s in senses) else NO_IN_CONTRAST
    ancestors = _ancestors(sense)
    for roots, kind in ((FURNITURE_ROOTS, "furniture"), (CONTAINER_ROOTS, "thing"), (INSIDE_ROOTS, "enclosure")):
        if ancestors & roots:
            return kind
    if any(_garment(s) for s in senses):
        return "garment"
    if sense.lexname() == "noun.substance":
        return "place"
    return "object" if sense.lexname() in _BESIDE_LEXNAMES else NO_IN_CONTRAST
