"""What the spaCy parse of a caption says before any replacement word is looked for: the part of
the 3VL tree generator (`vlctl.captions.trees.TreeGenerator`) that reads tokens, not tables of
replacements.

- `retag`: forced tags (`pos_overrides`), then lower-case PROPN WordNet knows read as that word.
- `word_units`: token spans that are one word for levels and negatives (WordNet compounds as "fire
  hydrant", hyphenated words as "long-haired"); `wn_compound` decides the compounds.
- `fixed_phrases`: tokens inside a fixed phrase ("on top of", "next to").
- `skip_reason`: why a tree-POS token gets no negative (proper noun, copula, idiom, phrasal verb...).
- `renderer`: a level's text with one word replaced; `caption_words`: the caption's words and lemmas.

The tree's levels are `vlctl.captions.levels`; who does a verb (animacy) is `vlctl.captions.subjects`.

`wn` is a WordNet reader (`vlctl.captions.wordnet.load_wordnet`) or None: without WordNet there are
no compounds, no PROPN is retagged and every noun counts as animate.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

from vlctl.captions import prepositions as prep
from vlctl.captions import wordnet as wnmod
from vlctl.captions.inflection import _match_case, article_for
from vlctl.captions.prepositions import (
    ADP_REPLACED,
    AIR_OBJECTS,
    ARRANGEMENT_OBJECTS,
    GROUND_COVER_OBJECTS,
    NO_CONTRAST_OBJECT_LEXNAMES,
    NO_NEAR_OBJECTS,
    ORIENTATION_NOUNS,
    OVERHEAD_OBJECTS,
    POSITION_NOUNS,
    RELATION_PHRASES,
    RIDE_VERBS,
    VERB_ARGUMENT_ADP,
    VERTICAL_OBJECTS,
)
from vlctl.captions.subjects import animate_noun, is_animate_kind, subject_is_animate, subject_is_thing
from vlctl.captions.tables import (
    _COPULA,
    COLORS,
    COMPOUNDS,
    FIXED_PHRASES,
    NON_VISUAL_ADJ,
    PICTURE_NOUNS,
    POSTURE_VERBS,
    QUANTITY_NOUNS,
)
from vlctl.captions.wordnet import noun_lexname, wn_compound

# Objects that make an idiom with a bare preposition ("standing in line", "in half", "on display").
IDIOM_OBJECTS = frozenset({"line", "place", "half", "order", "charge", "public", "use", "action", "progress",
                           "display", "fire", "time", "bed", "hand", "top", "front", "sale", "board", "duty",
                           "view", "case", "fact", "general", "particular", "addition", "pairs", "groups",
                           "home", "work", "school", "sea", "night"})  # (bare: "at home", "at sea")
# Verb + preposition pairs WordNet lacks as lemmas but that are one verb ("holding onto a bag").
PHRASAL_VERBS = frozenset({("hold", "onto"), ("hang", "onto"), ("hold", "on"), ("lean", "on"), ("rely", "on"),
                           ("look", "into"), ("look", "after"), ("get", "on"), ("get", "off"), ("take", "off"),
                           ("put", "on"), ("line", "up"), ("dress", "up"), ("pick", "up"), ("set", "up"),
                           ("depend", "on"), ("focus", "on"), ("wait", "for"), ("look", "for"), ("reach", "for"),
                           ("cling", "to"), ("hold", "up"), ("stare", "at"), ("gaze", "at"), ("feed", "on"),
                           ("show", "off"), ("feast", "on"), ("graze", "on"), ("live", "on"), ("chew", "on")})
# Said after the reason of the seventh round's skips (a word with a contrast a reader would not accept in
# its caption: "near a desert setting", "a light and gloomy day", "a plate lying on a tray"): its level takes a
# negative of another of its words instead (trees.TreeGenerator._second_candidates), so the count per tree stays.
SECOND_CANDIDATE = "; the level takes another word's negative instead"
_OVERRIDE_TAGS = frozenset({"NOUN", "ADJ", "ADP", "VERB", "ADV", "DET", "NUM", "PROPN", "PRON", "CCONJ", "X"})


def _tag_for(pos: str, tag: str) -> str:
    """A Penn tag for a forced coarse POS, keeping the original's number or verb form."""
    if pos == "NOUN":
        return "NNS" if tag in ("NNS", "NNPS") else "NN"
    if pos == "VERB":
        return tag if tag.startswith("VB") else "VB"
    return {"ADJ": "JJ", "ADP": "IN", "ADV": "RB", "DET": "DT", "NUM": "CD", "PROPN": "NNP", "PRON": "PRP",
            "CCONJ": "CC"}.get(pos, "XX")


@functools.lru_cache(maxsize=100_000)
def _verb_lemma(word: str) -> str:
    from lemminflect import getLemma

    got = getLemma(word, "VERB")
    return got[0] if got else word


def _crude_base(lower: str, tag: str) -> str:
    """Base form without WordNet (curated-table lookups only): drop a plural -s."""
    if tag == "NNS" and lower.endswith("s") and not lower.endswith("ss"):
        return lower[:-1]
    return lower


# --- the parse ---------------------------------------------------------------------------------


def retag(doc, overrides: Mapping[str, str], wn) -> None:
    """Forced tags (pos_overrides), then lower-case PROPN that WordNet knows as a common word
    ("white" in "white surfboard") read as that word: before noun chunks are computed."""
    for tok in doc:
        lower = tok.lower_
        if lower in overrides:
            pos = overrides[lower]
            tok.tag_ = _tag_for(pos, tok.tag_)
            tok.pos_ = pos
        elif tok.pos_ == "PROPN" and (tok.text.islower() or tok.i == 0) and wn is not None:
            noun, adj = wnmod.knows(wn, lower, "NOUN"), wnmod.knows(wn, lower, "ADJ")
            if adj and (tok.dep_ in ("amod", "compound") or not noun):
                tok.pos_, tok.tag_ = "ADJ", "JJ"
            elif noun:
                tok.pos_, tok.tag_ = "NOUN", "NNS" if tok.tag_ == "NNPS" else "NN"
    if wn is not None:
        wnmod.fix_misread(doc, wn)


def caption_words(doc, wn) -> frozenset[str]:
    """Every word of the caption, lowercased, and its WordNet base form (cached on the doc)."""
    if "vlctl_words" not in doc.user_data:
        doc.user_data["vlctl_words"] = frozenset(w for t in doc if t.is_alpha for w in (
            t.lower_, wnmod.base_form(wn, t.lower_, "VERB" if t.pos_ == "VERB" else "NOUN")))
    return doc.user_data["vlctl_words"]


def word_units(doc, wn) -> dict[int, tuple[int, int]]:
    """Token spans that are one word for levels and negatives: WordNet compounds ("fire
    hydrant", "hot dog") and hyphenated words ("long-haired"). {token index: (start, end)}."""
    where: dict[int, tuple[int, int]] = {}
    i, n = 0, len(doc)
    while i < n:
        j = i
        # hyphenated: word-word with no spaces around the hyphen
        while (j + 2 < n and doc[j + 1].text == "-" and not doc[j].whitespace_ and not doc[j + 1].whitespace_
               and doc[j + 2].is_alpha):
            j += 2
        if j > i:
            for k in range(i, j + 1):
                where[k] = (i, j + 1)
            i = j + 1
            continue
        if (wn is not None and i + 1 < n and doc[i].is_alpha and doc[i + 1].is_alpha
                and doc[i].pos_ in ("NOUN", "ADJ", "PROPN", "VERB") and doc[i + 1].pos_ in ("NOUN", "ADJ", "PROPN")
                and doc[i].lower_ not in NON_VISUAL_ADJ
                and (f"{doc[i].lower_} {doc[i + 1].lower_}" in COMPOUNDS
                     or wn_compound(wn, doc[i], doc[i + 1]))):
            where[i] = where[i + 1] = (i, i + 2)
            i += 2
            continue
        i += 1
    return where


def fixed_phrases(doc) -> dict[int, str]:
    """Tokens inside a fixed phrase ("on top of", "next to", "a couple of"): {index: phrase}."""
    low = [t.lower_ for t in doc]
    out: dict[int, str] = {}
    phrases = FIXED_PHRASES
    if any(w in PICTURE_NOUNS for w in low):
        phrases = (*FIXED_PHRASES, ("black", "and", "white"))  # the picture's style
    for phrase in phrases:
        k = len(phrase)
        for i in range(len(low) - k + 1):
            if tuple(low[i:i + k]) == phrase:
                for j in range(i, i + k):
                    out.setdefault(j, " ".join(phrase))
    return out


def renderer(doc, caption: str, lead: int, pieces, p: int, span: tuple[int, int]) -> Callable[[str], str]:
    """The level text (its `pieces`, joined by " and ") with the word at `span` (in piece p) replaced."""
    u0, u1 = span
    s = lead + doc[u0].idx
    n = lead + doc[u1 - 1].idx + len(doc[u1 - 1].text) - s
    art = doc[u0 - 1] if u0 > 0 and doc[u0 - 1].lower_ in ("a", "an") else None
    art_s = lead + art.idx if art is not None and lead + art.idx >= pieces[p][0] else None

    def render(word: str) -> str:
        parts = [caption[x:y] for x, y in pieces]
        x0 = pieces[p][0]
        if art_s is not None:
            # a/an agreement with the new word ("an old photo" -> "a young photo")
            new_art = _match_case(article_for(word.lower()), art.text)
            head = caption[x0:art_s] + new_art + caption[art_s + len(art.text):s]
        else:
            head = caption[x0:s]
        parts[p] = head + word + caption[s + n:pieces[p][1]]
        return " and ".join(parts)
    return render


def relation_phrase(doc, tok, fixed: dict[int, str], units, wn) -> tuple[int, int, str] | None:
    """(start, end, kind) when `tok` ends ("of", "to") a relation phrase replaced whole (negatives.
    RELATION_PHRASES: "in front of") whose object allows a false contrast; kind picks the contrast."""
    phrase = fixed.get(tok.i)
    if phrase not in RELATION_PHRASES:
        return None
    start = tok.i + 1 - len(phrase.split())
    if start < 0 or " ".join(t.lower_ for t in doc[start:tok.i + 1]) != phrase:
        return None
    end = tok.i + 1
    objs = [c for c in tok.children if c.dep_ == "pobj"]
    if not objs or objs[0].pos_ == "PRON":
        return None
    obj = doc[units[objs[0].i][1] - 1] if objs[0].i in units else objs[0]
    if obj.lower_ in GROUND_COVER_OBJECTS or obj.lower_ in NO_NEAR_OBJECTS or obj.lower_ in POSITION_NOUNS or (
            noun_lexname(wn, obj) in NO_CONTRAST_OBJECT_LEXNAMES | wnmod.ABSTRACT_LEXNAMES):
        return None  # "next to the water", "on top of the front", "in front of the morning"
    if obj.lower_ in ("other", "another") or (phrase == "in the middle of" and is_animate_kind(wn, obj)) or (
            "front" in phrase and noun_lexname(wn, obj) in wnmod.LAND_LEXNAMES):
        return None  # "in front of each other", "in the corner of some zebras", "in back of the ocean"
    road = wn is not None and wnmod.has_ancestor(wn, wnmod.base_form(wn, obj.lower_, "NOUN"), wnmod.ROAD_ROOTS)
    return start, end, "road" if road else "*"


# --- tokens: why no negative, animacy ----------------------------------------------------------


def skip_reason(doc, tok, fixed: dict[int, str], units: dict[int, tuple[int, int]], wn=None,
                open_vocab: bool = True) -> str | None:
    """Why a tree-POS token gets no negative before any candidate is looked for, or None.
    (`wn`: WordNet, for the kinds of preposition object and verb subject; None skips those checks.
    `open_vocab`: False for a closed domain's generator (a `vocabulary`), whose trees the eighth round's
    rules leave as they were: the shipped scene fine-tunes are keyed by them.)"""
    lower = tok.lower_
    eighth = wn is not None and open_vocab  # issue 21's eighth round (GENERATOR_VERSION 3vl-trees-9)
    if tok.pos_ == "PROPN":
        return "proper noun"
    if lower in _COPULA:
        return "copula"
    if tok.i in units and units[tok.i][1] - units[tok.i][0] > 1:
        a, b = units[tok.i]
        if any(doc[k].text == "-" for k in range(a, b)):
            return f"part of hyphenated word {doc[a:b].text!r}"
        if tok.i != b - 1:
            return f"modifier inside compound {doc[a:b].text!r}"
    if tok.i in fixed:
        return f"fixed phrase {fixed[tok.i]!r}"
    if tok.pos_ == "ADP":
        if lower == "of":
            return "'of' is never replaced"
        if tok.dep_ == "prt":
            return "particle of a phrasal verb"
        if lower not in ADP_REPLACED:
            return "no preposition contrast that keeps the grammar"
        if not any(c.dep_ in ("pobj", "pcomp") for c in tok.children):
            return "preposition without an object"
        if lower == "with" and tok.head.pos_ not in ("NOUN", "PROPN", "PRON"):
            return "'with' governed by a verb"
        if lower == "by" and (tok.dep_ == "agent" or tok.head.tag_ == "VBN"):
            return "'by' of a passive agent"  # "pulled by horses" -> "pulled behind horses"
        head = tok.head
        # (a curated list: WordNet's verb lemmas are too broad, "stand_in" = substitute)
        if head.pos_ == "VERB" and head.i == tok.i - 1 and (_verb_lemma(head.lower_), lower) in PHRASAL_VERBS:
            return f"phrasal verb {head.text + ' ' + tok.text!r}"
        objs = [c for c in tok.children if c.dep_ == "pobj"]
        if not objs:  # "leans in playing": a clause, not a place, follows
            return "preposition without a noun object"
        lemma = None  # the object's WordNet lemma: a compound's ("tennis_racket"), else the word's
        if objs[0].i in units:  # "in mid-air": the unit's head ("air"); "a tennis racket": the compound
            u0, u1 = units[objs[0].i]
            objs = [doc[u1 - 1]]
            if wn is not None and not any(doc[k].text == "-" for k in range(u0, u1)):
                lemma = "_".join([t.lower_ for t in doc[u0:u1 - 1]] + [wnmod.base_form(wn, doc[u1 - 1].lower_, "NOUN")])
        if head.pos_ == "VERB" and (_verb_lemma(head.lower_), lower) in VERB_ARGUMENT_ADP:
            return f"argument of the verb {head.text + ' ' + tok.text!r}"  # "engaging in a sport"
        if (why := _adp_object_reason(wn, tok, objs[0], lemma)) is not None:
            return why
        if eighth and lower == "with" and objs and any(c.dep_ == "nummod" for c in objs[0].children):
            return f"counted object {tok.text + ' ' + objs[0].text!r}" + SECOND_CANDIDATE  # "a room without two beds"
        if lower in ("with", "without") and objs and objs[0].lower_ in QUANTITY_NOUNS:
            return f"quantity object {tok.text + ' ' + objs[0].text!r}"  # "without a variety of items"
        if objs and lower in ("on", "in") and objs[0].lower_ in NO_NEAR_OBJECTS:
            return f"no false contrast for {tok.text + ' ' + objs[0].text!r}"
        if objs and objs[0].lower_ in IDIOM_OBJECTS and not any(c.dep_ in ("det", "poss") for c in objs[0].children):
            return f"idiom {tok.text + ' ' + objs[0].text!r}"
        if objs and objs[0].pos_ == "PRON":
            return f"pronoun object {tok.text + ' ' + objs[0].text!r}"
        if objs and objs[0].lower_ in ("other", "another") and tok.i + 1 < len(doc) and doc[tok.i + 1].lower_ in (
                "each", "one"):
            return f"reciprocal object {doc[tok.i:objs[0].i + 1].text!r}"  # "under each other" is absurd
        nxt = doc[tok.i + 1] if tok.i + 1 < len(doc) else None
        if nxt is not None and nxt.lower_ in IDIOM_OBJECTS and nxt.pos_ == "NOUN":
            return f"idiom {tok.text + ' ' + nxt.text!r}"  # "on display area": the idiom before a noun
        whole = _compound_whole(tok.head) if lower in ("with", "without") and tok.head.pos_ == "NOUN" else ()
        if objs and wn is not None and any(wnmod.is_part_of(wn, objs[0].lower_, w) for w in whole):
            return f"part of its head {tok.head.text + ' ' + tok.text + ' ' + objs[0].text!r}"
        if objs and (objs[0].lower_ in GROUND_COVER_OBJECTS
                     or noun_lexname(wn, objs[0]) in NO_CONTRAST_OBJECT_LEXNAMES):
            return f"no false contrast for {tok.text + ' ' + objs[0].text!r} (ground, weather or body part)"
        # eighth round: "a girl on a beach" -> "near a beach", "a clock tower on a shore" -> "near a shore", "at the
        # beach" -> "near the beach", "near a mountain of rocks" -> "in" are not clearly false (one is near what one is
        # on or at); a thing's "on" keeps its contrasts ("a cat on a table" -> "under a table")
        if eighth and lower in ("on", "at", "near") and adp_kind(wn, tok) == "place":
            return f"no false contrast for {tok.text + ' ' + objs[0].text!r} (a place one is on, at or near)" + SECOND_CANDIDATE
        if wn is not None and adp_kind(wn, tok) == prep.NO_IN_CONTRAST:  # seventh round: "near a desert setting"
            return f"no contrast for {tok.text + ' ' + objs[0].text!r} (a region, water or unknown)" + SECOND_CANDIDATE
    if tok.pos_ == "ADJ" and lower not in RELATIONAL_NOUNS and any(c.lower_ == "of" for c in tok.children):
        # "boxes full of chicks" -> "empty of chicks": the complement belongs to the adjective
        return "adjective with a complement"
    if tok.pos_ == "ADJ" and lower in NON_VISUAL_ADJ:
        return "determiner-like adjective"
    # "a dark and gloomy day" -> "a light and gloomy day" contradicts itself (seventh round): no swap of an
    # adjective joined ("and", ",") to another WordNet adjective; a colour of the pair may change ("a red and
    # shiny car" -> "a blue and shiny car"), and so may one beside a determiner ("clean and ready")
    pair = [c for c in [*(c for c in tok.children if c.dep_ == "conj"), *([tok.head] if tok.dep_ == "conj" else [])]
            if c.pos_ == "ADJ" and all(t.pos_ in ("CCONJ", "PUNCT") for t in doc[min(c.i, tok.i) + 1:max(c.i, tok.i)])
            and c.lower_ not in COLORS | NON_VISUAL_ADJ and wnmod.knows(wn, c.lower_, "ADJ")] if (
        tok.pos_ == "ADJ" and lower not in COLORS) else []
    if pair:
        return f"adjective coordinated with {pair[0].text!r}" + SECOND_CANDIDATE
    nxt = doc[tok.i + 1] if tok.i + 1 < len(doc) else None
    if (tok.pos_ == "ADJ" and nxt is not None and nxt.dep_ == "compound" and nxt.pos_ == "NOUN" and nxt.i not in units
            and nxt.head.i > nxt.i and nxt.head.pos_ != "ADP" and nxt.head.lower_ not in RELATIONAL_NOUNS):
        # "an old fashion red car": the adjective may be the noun modifier's ("old fashion"), an idiom
        return f"adjective before the noun modifier {doc[tok.i + 1].text!r}"
    if tok.pos_ == "ADJ" and lower == "light" and nxt is not None and nxt.pos_ == "NOUN" and nxt.lower_ not in COLORS:
        return f"noun modifier or weight {'light ' + nxt.text!r}"  # "a light pole" -> "a dark pole" (fifth round)
    if tok.pos_ == "ADJ" and tok.i > 0 and doc[tok.i - 1].lower_ == "half":
        return f"idiom {'half ' + tok.text!r}"  # "half full" = "half empty"
    if tok.pos_ == "NOUN" and tok.dep_ == "compound" and tok.head.i > tok.i:
        return f"noun modifier of {tok.head.text!r}"
    if tok.pos_ == "NOUN":
        # the head of a noun compound WordNet does not know: a new head under the old modifier is
        # a thing nobody says ("a computer desk" -> "a computer bench", "a parking meter lamp")
        unit = units.get(tok.i, (tok.i, tok.i + 1))
        mods = [c for t in doc[unit[0]:unit[1]] for c in t.children if c.dep_ in ("compound", "nmod")
                and c.pos_ in ("NOUN", "PROPN") and not unit[0] <= c.i < unit[1] and c.i < tok.i]
        # ("a television remote control": the modifier hangs on "remote"; spaCy says nmod)
        if mods:
            return f"head of the noun compound {doc[mods[0].i:tok.i + 1].text!r}"
    if tok.pos_ == "VERB":
        if any(c.dep_ == "prt" for c in tok.children):
            return "verb of a phrasal verb"
        if eighth and any(c.pos_ == "ADP" and c.i == tok.i + 1 and not any(c.children) for c in tok.children):
            return "verb of a phrasal verb (its particle tagged a preposition)" + SECOND_CANDIDATE  # "team mates look on" -> "point on"
        if eighth and _verb_lemma(lower) in POSTURE_VERBS and any(
                o.head.lower_ in ("in", "into", "on") and o.lower_ in WATER_OBJECTS
                for o in _place_objects(tok, units)):
            return "posture in water (floating)" + SECOND_CANDIDATE  # "birds sitting in the water" -> "lying in the water" (eighth round)
        nxt = doc[tok.i + 1] if tok.i + 1 < len(doc) else None
        if nxt is not None and nxt.pos_ == "ADP" and (_verb_lemma(lower), nxt.lower_) in PHRASAL_VERBS:
            return f"phrasal verb {tok.text + ' ' + nxt.text!r}"
        if tok.tag_ == "VB" and tok.i > 0 and doc[tok.i - 1].lower_ == "to":
            return "infinitive (no subject to contrast)"
        if wn is not None and _verb_lemma(lower) in POSTURE_VERBS and subject_is_thing(wn, tok):
            return "posture verb of a thing (sits = stands = is there)"
        # (seventh round: only a subject known to be alive changes posture, "a plate of food lying on a tray")
        if wn is not None and _verb_lemma(lower) in POSTURE_VERBS and not subject_is_animate(wn, tok):
            return "posture verb of no known person or animal" + SECOND_CANDIDATE
        # "flying through the air" -> "walking through the air", "riding a snowboard while flying through
        # the air" -> "pushing"; "standing in line" -> "lying in line", "waiting in line" -> "sleeping"
        linked = [tok, *(c for c in tok.children if c.dep_ in ("advcl", "conj", "xcomp") and c.pos_ == "VERB")]
        if tok.dep_ in ("advcl", "conj", "xcomp") and tok.head.pos_ == "VERB":
            linked.append(tok.head)
        if any(o.lower_ in AIR_OBJECTS and o.head.lower_ in ("in", "into", "through", "across") for v in linked
               for o in _place_objects(v, units)):  # (not "a giraffe standing against the sky")
            return "verb done in the air"  # (no second candidate: "a truck flying in the sky" is as absurd)
        if any(o.head.lower_ in ("in", "into") and o.i not in fixed and (o.lower_ in ARRANGEMENT_OBJECTS or (
                o.lower_ in IDIOM_OBJECTS and not any(c.dep_ in ("det", "poss") for c in o.children)))
               for o in _place_objects(tok, units)):  # (not "in front of", "left of a circle")
            return "verb of an idiom or arrangement ('in line')" + SECOND_CANDIDATE
    if eighth and tok.pos_ == "NOUN" and lower in COLORS and tok.dep_ == "pobj" and tok.head.lower_ in ("in", "into"):
        return "colour of clothes" + SECOND_CANDIDATE  # "a man in orange" -> "a man in banana" (eighth round)
    if eighth and tok.pos_ == "NOUN" and tok.dep_ == "pobj" and tok.head.lower_ == "for" and _verb_lemma(tok.head.head.lower_) == "pose":
        return "what one poses for" + SECOND_CANDIDATE  # "posing for the camera" -> "for the keyboard" (eighth round)
    if tok.pos_ == "NOUN" and lower in QUANTITY_NOUNS and any(c.lower_ == "of" for c in tok.children):
        return "head of a quantity phrase"
    if tok.pos_ == "NOUN" and tok.dep_ == "pobj" and tok.head.lower_ == "of" and tok.head.head.lower_ in (
            "pair", "pairs") and not is_animate_kind(wn, tok):
        return "object of 'a pair of'"  # things that come in pairs: "a pair of skis" -> "a pair of balls"
    if tok.pos_ == "NOUN" and wn is not None and tok.dep_ == "pobj" and tok.head.lower_ == "of" and \
            wnmod.is_compound(wn, (tok.head.head.lower_, "of", wnmod.base_form(wn, lower, "NOUN"))):
        return f"part of the compound {doc[tok.head.head.i:tok.i + 1].text!r}"  # "a body of water"
    if tok.pos_ == "VERB" and tok.tag_ == "VBG" and tok.dep_ == "amod" and wn is not None and not animate_noun(
            wn, tok.head):
        return "participle of a thing"  # "the running water" -> "the jumping water"
    return None


def _adp_object_reason(wn, tok, obj, lemma: str | None = None) -> str | None:
    """Why a preposition's object allows no false contrast (fourth round, issue 21), or None.
    `lemma`: the object's WordNet lemma when it is a compound ("tennis_racket")."""
    lower, o = tok.lower_, obj.lower_
    if o in POSITION_NOUNS or o in ORIENTATION_NOUNS:  # "on the front" -> "near the front" stays true
        return f"position object {tok.text + ' ' + obj.text!r}"  # ("direction": a noun.location in WordNet)
    head = tok.head
    verb = _verb_lemma(head.lower_) if head.pos_ == "VERB" else None
    if lower == "on" and o in VERTICAL_OBJECTS and verb not in SUPPORT_VERBS:  # "a crucifix on the wall" is near
        return f"vertical surface {tok.text + ' ' + obj.text!r}"  # (not "birds sitting on a wall")
    if lower == "on" and verb in RIDE_VERBS and wn is not None and prep.object_kind(wn, wnmod.base_form(
            wn, o, "NOUN")) != "place" and (o.endswith(("board", "boards")) or any(c.dep_ == "dobj" for c in head.children)):
        return f"what {head.text!r} is done on"  # "riding waves on a surfboard" -> "beside a surfboard"
    if lower == "near" and noun_lexname(wn, head) == "noun.body":  # "a giraffe's neck near branches" -> "on"
        return f"body part {head.text + ' ' + tok.text!r}"
    if wn is None:
        return None
    base = lemma or wnmod.base_form(wn, o, "NOUN")
    noun = obj.pos_ in ("NOUN", "PROPN")
    lex = wnmod.first_lexname(wn, base) if noun else None
    if lower == "in" and o in COLORS:  # "a man in orange" -> "beside orange": the colour of clothes
        return f"colour of clothes {tok.text + ' ' + obj.text!r}" + SECOND_CANDIDATE
    if lower in ("in", "into") and (o in ARRANGEMENT_OBJECTS or lex == "noun.group"):
        return f"arrangement {tok.text + ' ' + obj.text!r}"  # "walking in a single file line", "in a crowd"
    # "in a baseball game" -> "near a baseball game" (a colour is a thing's: "above a small purple [cube]")
    if noun and o not in COLORS and wnmod.is_abstract(wn, base):
        return f"abstract object {tok.text + ' ' + obj.text!r}"
    if lower in ("on", "in") and wnmod.has_ancestor(wn, base, wnmod.ROAD_ROOTS):
        return f"no false contrast for {tok.text + ' ' + obj.text!r} (a road)"  # "on the freeway" -> "near"
    if lower == "at" and lex not in ("noun.location", "noun.artifact", "noun.object"):  # "at twilight", "at a pace"
        return f"no false contrast for {tok.text + ' ' + obj.text!r} (not a place)"
    if lower == "over" and lex in wnmod.LAND_LEXNAMES:  # "flying over a rural area" -> "under a rural area"
        return f"no false contrast for {tok.text + ' ' + obj.text!r} (a place below)"
    kind = adp_kind(wn, tok)
    if kind == "garment" and tok.head.pos_ == "VERB":  # "dressed in", "pulling on a glove"
        return f"garment of the verb {tok.head.text + ' ' + tok.text!r}"
    return None


def _place_objects(verb, units) -> list:
    """The objects of a verb's prepositions ("flying through the air" -> air; a word unit's head)."""
    objs = [o for p in verb.children if p.dep_ == "prep" for o in p.children if o.dep_ == "pobj"]
    return [verb.doc[units[o.i][1] - 1] if o.i in units else o for o in objs]


def adp_kind(wn, tok) -> str:
    """The preposition's object kind that picks its contrast (prepositions.ADP_CONTRASTS): `prepositions.
    object_kind`'s (`in_kind`'s for "in"), "overhead" (under an umbrella), "support" (on what a verb or a
    person rests on: "sitting on a bench", "a person on a skateboard") or "animate" (a person or animal)."""
    lower = tok.lower_
    objs = [c for c in tok.children if c.dep_ == "pobj"]
    if objs and wn is not None:  # ("in" reads a plural that is a lemma of its own as itself: "in the woods")
        kind = prep.in_kind(wn, objs[0].lower_) if lower == "in" else prep.object_kind(wn, wnmod.base_form(
            wn, objs[0].lower_, "NOUN"))
    else:
        kind = "thing"
    if lower == "under" and objs and objs[0].lower_ in OVERHEAD_OBJECTS:
        kind = "overhead"
    head = tok.head
    subj = [c for c in head.children if c.dep_ == "nsubj"] if head.pos_ == "AUX" else [head]  # "people are on a boat"
    if lower == "on" and kind == "thing" and (head.pos_ == "VERB" or (
            subj and subj[0].pos_ == "NOUN" and wn is not None and animate_noun(wn, subj[0], people_only=True)) or (
            subj and subj[0].lower_ in PERSON_PRONOUNS)):  # (eighth round: "two men ..., one on a skateboard")
        return "support"  # (a person is not under the skateboard he is on)
    return "animate" if objs and kind == "thing" and is_animate_kind(wn, objs[0]) else kind


def lack_fits(wn, verb, word: str) -> bool:
    """A thing's or place's "has" -> "lacks" (fifth round: "a kitchen has a stove"), not of what is its own
    ("a building has its lights on"), nor a person's or animal's ("a giraffe lacks its legs")."""
    return _verb_lemma(word) == "lack" and wn is not None and subject_is_thing(wn, verb) and not any(
        c.dep_ == "poss" for o in verb.children if o.dep_ == "dobj" for c in o.children)


def _compound_whole(noun) -> tuple[str, ...]:
    """A noun and its noun modifiers ("train wreck" -> ("wreck", "train")): the wholes a part of."""
    return (noun.lower_, *(c.lower_ for c in noun.children if c.dep_ == "compound" and c.pos_ == "NOUN"))


# --- what a noun's modifiers allow (issue 21) ----------------------------------------------------

# Nouns of a relation ("left of", "right of"): "X right of Y" is a relation, not one phrase.
RELATIONAL_NOUNS = frozenset({"left", "right", "front", "back", "top", "bottom", "side", "middle"})
# Verbs of resting on a support: "sitting on a bench" -> "beside a bench", never "under a bench".
SUPPORT_VERBS = POSTURE_VERBS | {"perch", "lean", "sleep", "ride", "kneel", "crouch", "squat", "balance", "lounge",
                                 "nap", "relax", "lay", "climb", "jump", "skate", "walk", "run", "land"}
# Verbs of rest, and the prepositions of a place they take ("sleeping on a bed", not "from a tree").
RESTING_VERBS = frozenset({"sleep", "sit", "stand", "lie", "rest"})
# Pronouns and numerals that stand for a person ("one on a skateboard", "someone on a bench").
PERSON_PRONOUNS = frozenset({"one", "he", "she", "someone", "somebody", "another", "they", "everyone"})
# Water one sits in by floating: no posture contrast ("ducks sitting in the water" -> "lying in the water").
WATER_OBJECTS = frozenset({"water", "waters", "ocean", "sea", "lake", "river", "pond", "pool", "waves", "surf"})
# Adjectives that fit any noun of a kind ("a big red dog" -> "a big red cat"); every other modifier
# ("tusked", "shallow", "grassy", "grilled", a participle) belongs to its noun, and the noun is
# then not replaced ("a tusked giraffe", "a shallow street", "a grilled pasta"): the modifier is.
SIZE_ADJ = frozenset({"big", "small", "large", "little", "tiny", "huge", "giant", "tall", "short", "long"})
CHILD_SIZES = SIZE_ADJ - {"tall", "short", "long"}  # "a little girl" -> "a big girl" reads odd (no size swap)
FREE_ADJ = SIZE_ADJ | frozenset({"old", "new", "nice", "beautiful", "pretty", "cute", "lovely", "dirty", "clean",
                                 "wet", "dry", "dark", "bright", "empty", "full", "open", "closed", "wooden", "metal",
                                 "plastic", "young", "adult", "colorful", "fresh", "busy", "stuffed", "favorite",
                                 "large", "white"}) | NON_VISUAL_ADJ  # "several", "other": determiners


def noun_modifiers(noun, start: int | None = None) -> list:
    """The adjective and participle modifiers of a noun token (amod, with their conjuncts: "a
    black and white cat"), less those inside its word unit from `start` ("hot" of "hot dog")."""
    out = []
    for c in noun.children:
        if c.dep_ == "amod" and c.pos_ in ("ADJ", "VERB") and (start is None or c.i < start):
            out.append(c)
            out.extend(x for x in c.children if x.dep_ == "conj" and x.pos_ in ("ADJ", "VERB"))
    return out


def modifiers_fit(wn, noun, new_base: str, colors: dict, start: int | None = None) -> bool:
    """Whether every modifier of `noun` still fits when the noun becomes `new_base` (a lemma).
    Between two artifacts or two people (the tables' "boat" -> "car", "man" -> "woman") any
    modifier fits ("a rustic boat" -> "a rustic car", "a smiling woman" -> "a smiling guy");
    otherwise (animals, food, places) free adjectives (FREE_ADJ) only ("a tusked giraffe", "a
    shallow street", "a grilled pasta" are not). A colour must be one the new noun's kind takes
    (`colors`: {lexname: allowed colours}, a lexname absent = any), and no age or size word may
    stay when the noun's age changes ("a small child" -> "a small adult")."""
    mods = noun_modifiers(noun, start)
    if not mods:
        return True
    sense = wnmod.most_frequent_sense(wn, new_base.replace(" ", "_"), "NOUN") if wn is not None else None
    lex = None if sense is None else sense.lexname()
    old = wnmod.base_form(wn, noun.lower_, "NOUN") if wn is not None else noun.lower_
    old_sense = wnmod.most_frequent_sense(wn, old, "NOUN") if wn is not None else None
    same_kind = lex in ("noun.artifact", "noun.person") and old_sense is not None and old_sense.lexname() == lex
    for m in mods:
        w = m.lower_
        if w in COLORS:
            allowed = colors.get(lex)
            if allowed is not None and w not in allowed:
                return False
            continue
        if w not in FREE_ADJ and not same_kind:
            return False
        if wn is not None and (w in SIZE_ADJ or w in ("young", "old", "adult")) and \
                wnmod.is_young(wn, old) != wnmod.is_young(wn, new_base):
            return False
    return True


# quantity nouns after which a bare singular is a mass noun ("a pile of broccoli", "a herd of sheep")
_MASS_QUANTITIES = QUANTITY_NOUNS - {"picture", "photo", "image", "view", "kind", "type", "side", "top", "front",
                                     "middle", "edge", "back", "bottom", "end", "part", "close", "piece", "slice"}


def after_quantity(tok) -> str | None:
    """The quantity noun of a bare noun right after "<quantity noun> of" (no determiner of its
    own: "a pile of broccoli" -> "pile", "a piece of fruit" -> "piece"), else None."""
    of = tok.head
    if (tok.dep_ == "pobj" and of.lower_ == "of" and of.head.lower_ in _MASS_QUANTITIES | {"piece", "slice"}
            and not any(c.dep_ in ("det", "poss", "nummod") for c in tok.children)):
        return of.head.lower_
    return None
