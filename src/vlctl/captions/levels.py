"""The levels of a 3VL caption tree (docs/methods.md §3.1): the caption's noun phrases, and the texts
built from them, first noun phrase, then each further one joined to the previous level (or to the first
phrase) by "and", then the caption up to it, last the whole caption. A joined level
is only of a thing one sees beside the first phrase (`joins_as_entity`, issue 21's eighth round).
"""

from __future__ import annotations

from vlctl.captions import prepositions as prep
from vlctl.captions import wordnet as wnmod
from vlctl.captions.parse import RELATIONAL_NOUNS
from vlctl.captions.prepositions import POSITION_NOUNS
from vlctl.captions.tables import COLORS, QUANTITY_NOUNS


def noun_phrases(doc, units: dict[int, tuple[int, int]]) -> list[tuple[int, int]]:
    """Noun chunks as token spans, less bare pronouns, never cutting a unit or a compound,
    with quantity phrases whole ("a couple of dogs", not "a couple")."""
    spans = []
    for c in doc.noun_chunks:
        if len(c) == 1 and (c.root.pos_ == "PRON" or c.root.lower_ in POSITION_NOUNS):
            continue  # "front" of "in front of a truck": "a motorcycle and front of a truck" is no phrase
        if c.root.lower_ == "close" and c.end < len(doc) and doc[c.end].lower_ == "up":
            continue  # "a close up of a sheep": "a close and rocks" is no phrase (eighth round)
        s, e = c.start, c.end
        s = min([s] + [units[k][0] for k in range(s, e) if k in units])
        e = max([e] + [units[k][1] for k in range(s, e) if k in units])
        while e < len(doc) and doc[e - 1].dep_ == "compound" and doc[e - 1].head.i >= e:
            e = doc[e - 1].head.i + 1
        # a noun the parser left outside ("a catchers" + "mitt"): a level must not end inside a compound
        while (e < len(doc) and doc[e - 1].pos_ == "NOUN" and doc[e].pos_ == "NOUN" and doc[e - 1].whitespace_
               and doc[e].lower_ not in RELATIONAL_NOUNS):
            e += 1
        spans.append((s, e))
    merged: list[tuple[int, int]] = []
    for s, e in spans:
        prev = merged[-1] if merged else None
        # "X of Y" is one phrase, for quantities ("a couple of dogs") and any "of" that attaches to X
        # ("a small party of people", "sunlight of window": "a small party and people" is not English)
        if (prev is not None and prev[1] < s and all(t.tag_ == "VBG" for t in doc[prev[1] + 1:s]) and doc[prev[1]].lower_ == "of"
                and ((doc[prev[1] - 1].lower_ in QUANTITY_NOUNS and doc[prev[1] - 1].pos_ == "NOUN")
                     or (prev[0] <= doc[prev[1]].head.i < prev[1] and doc[prev[1] - 1].lower_ not in RELATIONAL_NOUNS))):
            merged[-1] = (prev[0], e)
        elif prev is not None and s < prev[1]:
            merged[-1] = (prev[0], max(e, prev[1]))
        else:
            merged.append((s, e))
    return merged


# What a noun phrase names when it is not a thing one can see beside another (eighth round): "a person and a
# sunny day", "people and a game of tennis", "an elephant and the shade of a tree", "woman and nice hands".
NON_ENTITY_LEXNAMES = frozenset({"noun.time", "noun.act", "noun.event", "noun.state", "noun.attribute",
                                 "noun.cognition", "noun.phenomenon", "noun.feeling", "noun.process", "noun.relation",
                                 "noun.shape", "noun.quantity", "noun.motive", "noun.body"})
_WEAR_VERBS = frozenset({"wear", "dress", "clothe", "sport", "don"})


def joins_as_entity(wn, doc, span: tuple[int, int]) -> bool:
    """Whether the noun phrase at token `span` reads joined to the first one by "and" (a tree level "X and
    Y", eighth round, issue 21): no when it names a time, an act, a state, a body part ... (NON_ENTITY_LEXNAMES,
    by the most frequent sense of its head, or of the noun after a quantity's "of"), a garment worn ("a man and
    a black suit" of "a man in a black suit"), a marking one has ("sheep and red spots" of "sheep with red
    spots") or what one does something for ("a boy and a picture" of "a boy posing for a picture")."""
    root = doc[span[0]:span[1]].root
    if root.lower_ in QUANTITY_NOUNS:  # "a number of suitcases": the suitcases
        of = next((c for c in root.children if c.lower_ == "of"), None)
        root = next((c for c in of.children if c.dep_ == "pobj"), root) if of is not None else root
    link = root
    while link.dep_ == "conj" and link.head is not link:  # "wearing a black hat, black shirt and a tie"
        link = link.head
    if link.dep_ == "pobj" and link.head.lower_ == "for":
        return False
    if root.lower_ in COLORS:  # "a man in orange": the colour of his clothes, "a man and orange" is no phrase
        return False
    base = wnmod.base_form(wn, root.lower_, "NOUN")
    if root.i > span[0] and wnmod.is_compound(wn, (doc[root.i - 1].lower_, base)):
        base = f"{doc[root.i - 1].lower_}_{base}"  # "red traffic lights": a traffic light, not light
    sense = wnmod.most_frequent_sense(wn, base, "NOUN")
    if sense is None:
        return True
    if sense.lexname() in NON_ENTITY_LEXNAMES:
        return False
    head = link.head
    worn = (link.dep_ == "pobj" and head.lower_ in ("in", "with")) or (
        link.dep_ in ("dobj", "obj") and wnmod.base_form(wn, head.lower_, "VERB") in _WEAR_VERBS)
    if worn and prep.object_kind(wn, base) == "garment":
        return False
    return not (link.dep_ == "pobj" and head.lower_ == "with" and any(
        "marking.n.02" in {h.name() for h in s.closure(lambda x: x.hypernyms())} for s in wn.synsets(base, "n")[:5]))


def level_pieces(doc, caption: str, lead: int, units, wn=None) -> list[list[tuple[int, int]]]:
    """The tree's levels as lists of character pieces of `caption` (joined by " and " when
    several): NP1; then for each further noun phrase, the previous level and it, and the caption
    up to its end; last the whole caption. `lead`: the caption's leading whitespace; with `wn`, a
    verb's object is joined with the first noun phrase, not the prefix (fifth round)."""
    def chars(s: int, e: int) -> tuple[int, int]:
        return lead + doc[s].idx, lead + doc[e - 1].idx + len(doc[e - 1].text)

    spans = noun_phrases(doc, units)
    for k in range(len(spans) - 1 if wn is not None else 0, 0, -1):  # never "a meat" of "a meat covered sandwich"
        (s0, e0), (s1, e1) = spans[k - 1], spans[k]
        if s1 == e0 + 1 and doc[e0].tag_ in ("VBN", "VBD") and doc[e0 - 1].pos_ == "NOUN" and doc[s1].pos_ != "DET":
            spans[k - 1:k + 1] = [(s0, e1)]
    spans = [(s, e + 1) if wn is not None and e < len(doc) and doc[e].tag_ in ("VBP", "VBZ") and doc[e - 1].dep_ == "pobj"
             and all(t.is_punct for t in doc[e + 1:]) else (s, e) for s, e in spans]  # "under the cats chin"
    chunks = [chars(s, e) for s, e in spans]
    levels: list[list[tuple[int, int]]] = []
    if chunks:
        levels.append([chunks[0]])
        for k, c in enumerate(chunks[1:], 1):
            # a caption prefix that ends in a verb's object, joined: "a woman riding a bike and a basket"
            # reads as riding a basket; the first noun phrase and the new one instead ("a woman and a basket")
            # ... and after a verb, a preposition's object: "people walk across the street and red lights"
            # (eighth round) ... and never a phrase that is no thing beside the first (`joins_as_entity`)
            obj = wn is not None and k > 1 and (doc[spans[k - 1][1] - 1].dep_ in ("dobj", "obj") or doc[
                spans[k][0]:spans[k][1]].root.dep_ in ("pobj", "ROOT") and any(t.pos_ == "VERB" for t in doc[spans[0][1]:spans[k - 1][1]]))
            if wn is None or joins_as_entity(wn, doc, spans[k]):
                levels.append([chunks[0], c] if obj else levels[-1] + [c])
            levels.append([(lead, c[1])])
    levels.append([(0, len(caption))])
    return levels

