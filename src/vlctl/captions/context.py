"""The context of a caption that makes a replacement word absurd or still true (issue 21's eighth round):
`context_excluded` tests each candidate the curated tables give a noun or a verb of the caption, for
`vlctl.captions.trees.TreeGenerator` (open vocabularies only).
"""

from __future__ import annotations

from collections.abc import Callable

from vlctl.captions import wordnet as wnmod
from vlctl.captions.parse import WATER_OBJECTS, _verb_lemma
from vlctl.captions.wordnet import noun_lexname

# Sports whose names are balls too ("pitching a baseball" -> "pitching a tennis"): swapped only as the sport;
# the fixtures of a room (ROOM_NAMES) that stay true of it ("a bathroom with a sink" -> "with a toilet"), or are
# another room's ("a stove and a sink" -> "and a shower"); an animal someone owns is a pet ("her dog" -> "her zebra").
SPORTS = frozenset({"tennis", "baseball", "soccer", "football", "golf"})
ROOM_FIXTURES = {"bathroom": frozenset({"toilet", "sink", "bathtub", "shower", "mirror", "tub"}),
                 "kitchen": frozenset({"refrigerator", "fridge", "oven", "microwave", "stove", "sink", "dishwasher"})}
ROOM_NAMES = {"bathroom": frozenset({"bathroom", "restroom", "washroom", "lavatory", "bath"}),
              "kitchen": frozenset({"kitchen", "kitchenette"})}
PETS = frozenset({"dog", "cat", "horse", "puppy", "kitten", "pony"})
TIMES_OF_DAY = frozenset({"morning", "evening", "night", "afternoon", "noon", "dawn", "dusk"})
# Water that something in the caption floats on or holds ("a boat and the water" -> "and the snow", "a clear
# glass with some water" -> "some grass"): not swapped for land.
WATER_HOLDERS = frozenset({"boat", "ship", "kayak", "canoe", "surfboard", "surfer", "surf", "sail", "sailboat", "yacht",
                           "ferry", "raft", "jet", "swim", "drink", "glass", "bottle", "cup", "wave", "float", "duck",
                           "swan", "goose", "paddle", "wakeboard", "boater", "fountain", "fishing"})


def context_excluded(wn, doc, tok, base: str, caption_lemmas: frozenset[str]) -> Callable[[str], bool]:
    """(eighth round, issue 21) A test of a candidate replacement of `tok` (base form `base`) that the
    caption's context makes absurd or leaves true: a sport for a counted ball ("a baseball"), a fixture of a
    room the caption names ("a bathroom with a toilet and a sink" -> "and a bathtub") or of another room than
    the fixtures it names ("a stove and a sink" -> "and a shower"), an owned animal that is no pet ("her
    zebra"), another time of day after "at" ("at night" -> "at morning"), "balls" for a plural ("a man and
    skis" -> "and balls"), land for water something floats on or holds ("a boat and the water" -> "the snow"),
    swimming over or through something, walking over water ("a bird swimming over the water").
    `caption_lemmas`: `caption_words(doc, wn)`."""
    if tok.pos_ == "VERB":
        over = [c for c in tok.children if c.dep_ == "prep" and c.lower_ in ("over", "above", "through", "across",
                                                                               "past", "toward")]
        wet = any(o.lower_ in WATER_OBJECTS for c in over for o in c.children if o.dep_ == "pobj")
        return lambda w: bool(over) and _verb_lemma(w) == "swim" or wet and _verb_lemma(w) == "walk"
    out: set[str] = set()
    if base in SPORTS and (tok.tag_ == "NNS" or any(c.lower_ in ("a", "an") or c.dep_ == "nummod" for c in tok.children)):
        out |= SPORTS
    for room, fixtures in ROOM_FIXTURES.items():
        if base in fixtures and caption_lemmas & ROOM_NAMES[room]:
            out |= fixtures
        elif base in fixtures and any(caption_lemmas & (f - fixtures) for r, f in ROOM_FIXTURES.items() if r != room):
            out |= fixtures - set().union(*(f for r, f in ROOM_FIXTURES.items() if r != room))  # "a stove and a shower"
    if base in TIMES_OF_DAY and tok.head.lower_ == "at":  # "at night" -> "at morning" is not English
        out |= TIMES_OF_DAY | {"day"}
    if tok.tag_ == "NNS":  # "a man and skis" -> "a man and balls" (reads as a crude joke)
        out.add("balls")
    if base == "water" and caption_lemmas & WATER_HOLDERS:
        out |= {"grass", "snow", "sand", "dirt"}
    poss = any(c.dep_ == "poss" for c in tok.children) and noun_lexname(wn, tok) == "noun.animal"

    def excluded(w: str) -> bool:
        forms = {w, wnmod.base_form(wn, w, "NOUN")}  # the word and its lemma, looked up once
        return bool(forms & out) or (poss and not forms & PETS)
    return excluded

