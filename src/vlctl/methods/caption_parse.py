"""What the spaCy parse of a caption says before any replacement word is looked for: the part of
the 3VL tree generator (`vlctl.methods.trees.TreeGenerator`) that reads tokens, not tables of
replacements.

- `retag`: forced tags (`pos_overrides`), then lower-case PROPN that WordNet knows as a common
  word read as that word.
- `word_units`: token spans that are one word for levels and negatives (WordNet compounds as "fire
  hydrant", hyphenated words as "long-haired"); `wn_compound` decides the compounds.
- `fixed_phrases`: tokens inside a fixed phrase ("on top of", "next to").
- `noun_phrases`: the noun chunks the tree levels are made of, as token spans.
- `skip_reason`: why a tree-POS token gets no negative (proper noun, copula, idiom, phrasal verb...).
- `animate_subject`, `head_is_animate`, `animate_noun`: whether a verb's subject or an adjective's
  noun is a person or an animal (the replacement tables differ for them).

`wn` is a WordNet reader (`vlctl.methods.wordnet.load_wordnet`) or None: without WordNet there are
no compounds, no PROPN is retagged and every noun counts as animate.
"""

from __future__ import annotations

from collections.abc import Mapping

from vlctl.methods import wordnet as wnmod
from vlctl.methods.negatives import (
    _COPULA,
    ADP_REPLACED,
    COMPOUNDS,
    FIXED_PHRASES,
    GROUND_COVER_OBJECTS,
    NO_CONTRAST_OBJECT_LEXNAMES,
    NO_NEAR_OBJECTS,
    NON_VISUAL_ADJ,
    POSTURE_VERBS,
    QUANTITY_NOUNS,
)

# Objects that make an idiom with a bare preposition ("standing in line", "in half", "on display").
IDIOM_OBJECTS = frozenset({"line", "place", "half", "order", "charge", "public", "use", "action", "progress",
                           "display", "fire", "time", "bed", "hand", "top", "front", "sale", "board", "duty",
                           "view", "case", "fact", "general", "particular", "addition", "pairs", "groups"})
# Verb + preposition pairs WordNet lacks as lemmas but that are one verb ("holding onto a bag").
PHRASAL_VERBS = frozenset({("hold", "onto"), ("hang", "onto"), ("hold", "on"), ("lean", "on"), ("rely", "on"),
                           ("look", "into"), ("look", "after"), ("get", "on"), ("get", "off"), ("take", "off"),
                           ("put", "on"), ("line", "up"), ("dress", "up"), ("pick", "up"), ("set", "up"),
                           ("depend", "on"), ("focus", "on"), ("wait", "for"), ("look", "for"), ("reach", "for"),
                           ("cling", "to"), ("hold", "up"), ("stare", "at"), ("gaze", "at")})
_OVERRIDE_TAGS = frozenset({"NOUN", "ADJ", "ADP", "VERB", "ADV", "DET", "NUM", "PROPN", "PRON", "CCONJ", "X"})


def _tag_for(pos: str, tag: str) -> str:
    """A Penn tag for a forced coarse POS, keeping the original's number or verb form."""
    if pos == "NOUN":
        return "NNS" if tag in ("NNS", "NNPS") else "NN"
    if pos == "VERB":
        return tag if tag.startswith("VB") else "VB"
    return {"ADJ": "JJ", "ADP": "IN", "ADV": "RB", "DET": "DT", "NUM": "CD", "PROPN": "NNP", "PRON": "PRP",
            "CCONJ": "CC"}.get(pos, "XX")


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


def wn_compound(wn, first, second) -> bool:
    """A WordNet compound noun; with an adjective first, not a person ("old man" = father and
    "little girl" are an adjective and a noun for a caption; "hot dog" is food)."""
    words = (first.lower_, wnmod.base_form(wn, second.lower_, "NOUN"))
    if not wnmod.is_compound(wn, words):
        return False
    if first.pos_ != "ADJ":
        return True
    sense = wnmod.most_frequent_sense(wn, "_".join(words), "NOUN")
    return sense is not None and sense.lexname() != "noun.person"


def fixed_phrases(doc) -> dict[int, str]:
    """Tokens inside a fixed phrase ("on top of", "next to", "a couple of"): {index: phrase}."""
    low = [t.lower_ for t in doc]
    out: dict[int, str] = {}
    for phrase in FIXED_PHRASES:
        k = len(phrase)
        for i in range(len(low) - k + 1):
            if tuple(low[i:i + k]) == phrase:
                for j in range(i, i + k):
                    out.setdefault(j, " ".join(phrase))
    return out


def noun_phrases(doc, units: dict[int, tuple[int, int]]) -> list[tuple[int, int]]:
    """Noun chunks as token spans, less bare pronouns, never cutting a unit or a compound,
    with quantity phrases whole ("a couple of dogs", not "a couple")."""
    spans = []
    for c in doc.noun_chunks:
        if len(c) == 1 and c.root.pos_ == "PRON":
            continue
        s, e = c.start, c.end
        s = min([s] + [units[k][0] for k in range(s, e) if k in units])
        e = max([e] + [units[k][1] for k in range(s, e) if k in units])
        while e < len(doc) and doc[e - 1].dep_ == "compound" and doc[e - 1].head.i >= e:
            e = doc[e - 1].head.i + 1
        spans.append((s, e))
    merged: list[tuple[int, int]] = []
    for s, e in spans:
        prev = merged[-1] if merged else None
        if (prev is not None and prev[1] + 1 == s and doc[prev[1]].lower_ == "of"
                and doc[prev[1] - 1].lower_ in QUANTITY_NOUNS and doc[prev[1] - 1].pos_ == "NOUN"):
            merged[-1] = (prev[0], e)
        elif prev is not None and s < prev[1]:
            merged[-1] = (prev[0], max(e, prev[1]))
        else:
            merged.append((s, e))
    return merged


# --- tokens: why no negative, animacy ----------------------------------------------------------


def skip_reason(doc, tok, fixed: dict[int, str], units: dict[int, tuple[int, int]], wn=None) -> str | None:
    """Why a tree-POS token gets no negative before any candidate is looked for, or None.
    (`wn`: WordNet, for the kinds of preposition object and verb subject; None skips those checks.)"""
    lower = tok.lower_
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
        head = tok.head
        # (a curated list: WordNet's verb lemmas are too broad, "stand_in" = substitute)
        if head.pos_ == "VERB" and head.i == tok.i - 1 and (_verb_lemma(head.lower_), lower) in PHRASAL_VERBS:
            return f"phrasal verb {head.text + ' ' + tok.text!r}"
        objs = [c for c in tok.children if c.dep_ == "pobj"]
        if objs and lower in ("on", "in") and objs[0].lower_ in NO_NEAR_OBJECTS:
            return f"no false contrast for {tok.text + ' ' + objs[0].text!r}"
        if objs and objs[0].lower_ in IDIOM_OBJECTS and not any(c.dep_ in ("det", "poss") for c in objs[0].children):
            return f"idiom {tok.text + ' ' + objs[0].text!r}"
        if objs and objs[0].pos_ == "PRON":
            return f"pronoun object {tok.text + ' ' + objs[0].text!r}"
        if objs and (objs[0].lower_ in GROUND_COVER_OBJECTS
                     or noun_lexname(wn, objs[0]) in NO_CONTRAST_OBJECT_LEXNAMES):
            return f"no false contrast for {tok.text + ' ' + objs[0].text!r} (ground, weather or body part)"
    if tok.pos_ == "ADJ" and lower in NON_VISUAL_ADJ:
        return "determiner-like adjective"
    if tok.pos_ == "ADJ" and tok.i > 0 and doc[tok.i - 1].lower_ == "half":
        return f"idiom {'half ' + tok.text!r}"  # "half full" = "half empty"
    if tok.pos_ == "NOUN" and tok.dep_ == "compound" and tok.head.i > tok.i:
        return f"noun modifier of {tok.head.text!r}"
    if tok.pos_ == "NOUN":
        # the head of a noun compound WordNet does not know: a new head under the old modifier is
        # a thing nobody says ("a computer desk" -> "a computer bench", "a parking meter lamp")
        unit = units.get(tok.i, (tok.i, tok.i + 1))
        mods = [c for c in tok.children if c.dep_ == "compound" and c.pos_ in ("NOUN", "PROPN")
                and not unit[0] <= c.i < unit[1]]
        if mods:
            return f"head of the noun compound {doc[mods[0].i:tok.i + 1].text!r}"
    if tok.pos_ == "VERB":
        if any(c.dep_ == "prt" for c in tok.children):
            return "verb of a phrasal verb"
        nxt = doc[tok.i + 1] if tok.i + 1 < len(doc) else None
        if nxt is not None and nxt.pos_ == "ADP" and (_verb_lemma(lower), nxt.lower_) in PHRASAL_VERBS:
            return f"phrasal verb {tok.text + ' ' + nxt.text!r}"
        if tok.tag_ == "VB" and tok.i > 0 and doc[tok.i - 1].lower_ == "to":
            return "infinitive (no subject to contrast)"
        if wn is not None and _verb_lemma(lower) in POSTURE_VERBS and subject_is_thing(wn, tok):
            return "posture verb of a thing (sits = stands = is there)"
    if tok.pos_ == "NOUN" and lower in QUANTITY_NOUNS and any(c.lower_ == "of" for c in tok.children):
        return "head of a quantity phrase"
    return None


def animate_subject(wn, verb, people_only: bool = False) -> bool:
    """Whether the verb's subject (nsubj, or the noun an acl/relcl verb modifies) is a person
    or an animal (only a person with people_only), or a personal pronoun; True when unknown."""
    subj = [c for c in verb.children if c.dep_ in ("nsubj", "nsubjpass")]
    noun = subj[0] if subj else verb.head if verb.dep_ in ("acl", "relcl", "advcl") else None
    return True if noun is None else animate_noun(wn, noun, people_only)


_THING_LEXNAMES = frozenset({"noun.artifact", "noun.object", "noun.food", "noun.plant", "noun.substance",
                             "noun.location"})


def subject_is_thing(wn, verb) -> bool:
    """The verb's subject (as in `animate_subject`) is known to be a thing: an artifact, food,
    plant, substance, place or natural object ("a truck sits"), not a person, animal or group."""
    subj = [c for c in verb.children if c.dep_ in ("nsubj", "nsubjpass")]
    noun = subj[0] if subj else verb.head if verb.dep_ in ("acl", "relcl", "advcl") else None
    return noun is not None and noun_lexname(wn, noun) in _THING_LEXNAMES


def noun_lexname(wn, noun) -> str | None:
    """The WordNet lexicographer file of a noun token's most frequent sense ("noun.animal"), or None
    (no WordNet, not a noun, unknown word)."""
    if wn is None or noun.pos_ not in ("NOUN", "PROPN"):
        return None
    sense = wnmod.most_frequent_sense(wn, wnmod.base_form(wn, noun.lower_, "NOUN"), "NOUN")
    return None if sense is None else sense.lexname()


def head_is_animate(wn, adj) -> bool:
    """An adjective's noun is known to be a person or animal (not merely unknown)."""
    head = adj.head
    if head is adj or head.pos_ not in ("NOUN", "PROPN") or wn is None:
        return False
    sense = wnmod.most_frequent_sense(wn, wnmod.base_form(wn, head.lower_, "NOUN"), "NOUN")
    return sense is not None and sense.lexname() in ("noun.person", "noun.animal")


def animate_noun(wn, noun, people_only: bool = False) -> bool:
    """Whether a noun is a person or an animal (only a person with people_only) by its most
    frequent WordNet sense, a pronoun a personal one; True when unknown."""
    if wn is None:
        return True
    if noun.pos_ == "PRON":
        return noun.lower_ in ("he", "she", "they", "i", "we", "you", "who", "someone", "somebody", "everyone")
    if noun.pos_ not in ("NOUN", "PROPN"):
        return True
    sense = wnmod.most_frequent_sense(wn, wnmod.base_form(wn, noun.lower_, "NOUN"), "NOUN")
    kinds = ("noun.person",) if people_only else ("noun.person", "noun.animal")
    return sense is None or sense.lexname() in kinds
