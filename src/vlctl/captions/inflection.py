"""Word forms of a replacement: the plural of a noun, the tense of a verb, "a" or "an", and the
mass-or-plural reading of a noun ("a pile of sand" vs "a pile of apples"), so that a negative
changes one word and stays grammatical (lemminflect first, simple rules where it is silent).
"""

from __future__ import annotations

import functools

from vlctl.captions import wordnet as wnmod
from vlctl.captions.negatives import zipf
from vlctl.captions.text import _VOWELS

_IRREGULAR_PLURALS = {"man": "men", "woman": "women", "person": "people", "child": "children", "foot": "feet",
                      "tooth": "teeth", "mouse": "mice", "goose": "geese", "sheep": "sheep", "fish": "fish",
                      "deer": "deer", "ox": "oxen", "knife": "knives", "leaf": "leaves", "shelf": "shelves"}
_IRREGULAR_PAST = {"sit": "sat", "stand": "stood", "run": "ran", "eat": "ate", "ride": "rode", "hold": "held",
                   "fly": "flew", "lie": "lay", "sleep": "slept", "swim": "swam", "throw": "threw", "catch": "caught",
                   "hang": "hung", "make": "made", "take": "took", "wear": "wore", "put": "put", "sell": "sold",
                   "drink": "drank", "drive": "drove", "fall": "fell", "go": "went", "see": "saw", "sing": "sang"}


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
