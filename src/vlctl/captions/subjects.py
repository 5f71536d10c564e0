"""Who does a caption's verb: its subject, and whether that is a person, an animal, a group or a
thing (for the 3VL caption-tree negatives: a thing does not run, a person does not lack its legs).

Posture verbs (sit, stand, lie) are swapped only for a subject known to be alive
(`subject_is_animate`) ("a plate of food sitting on a tray" -> "lying on a tray" is absurd).
"""

from __future__ import annotations

from vlctl.captions import wordnet as wnmod
from vlctl.captions.tables import QUANTITY_NOUNS
from vlctl.captions.wordnet import base_form, is_compound, most_frequent_sense, noun_lexname

PEOPLE_GROUPS = ("people.n.01", "couple.n.01", "crowd.n.01", "team.n.01", "family.n.01", "audience.n.01")


def animate_subject(wn, verb, people_only: bool = False) -> bool:
    """Whether the verb's subject (nsubj, or the noun an acl/relcl verb modifies) is a person
    or an animal (only a person with people_only), or a personal pronoun; True when unknown."""
    # (a relative pronoun's antecedent: "a man that has bananas" -> the man)
    subj = [c for c in verb.children if c.dep_ in ("nsubj", "nsubjpass") and not _relative(verb, c)]
    if not subj and verb.dep_ == "conj" and verb.head.pos_ in ("VERB", "AUX") and verb.head is not verb:
        return animate_subject(wn, verb.head, people_only)  # "a clock hangs ... and reads 12:43": the clock's
    noun = subj[0] if subj else verb.head if verb.dep_ in ("acl", "relcl", "advcl") else None
    return True if noun is None else animate_noun(wn, noun, people_only)


def group_subject(wn, verb) -> bool:
    """The verb's subject (as in `animate_subject`) is a group ("people", "a crowd", "a group of")."""
    subj = [c for c in verb.children if c.dep_ in ("nsubj", "nsubjpass")]
    noun = subj[0] if subj else verb.head if verb.dep_ in ("acl", "relcl", "advcl") else None
    if wn is None or noun is None or noun.pos_ not in ("NOUN", "PROPN"):
        return False
    base = wnmod.base_form(wn, noun.lower_, "NOUN")
    return base in QUANTITY_NOUNS or wnmod.first_lexname(wn, base) == "noun.group"


_THING_LEXNAMES = frozenset({"noun.artifact", "noun.object", "noun.food", "noun.plant", "noun.substance",
                             "noun.location"})


def subject_noun(verb, through: tuple[str, ...] = ("acl", "relcl", "advcl")):
    """The verb's subject token (nsubj, or the noun an acl/relcl/advcl verb modifies), through the verbs
    it hangs on ("a plate topped with food sitting" -> plate; with `through` other links too), or None."""
    noun = verb
    for _ in range(3):
        subj = [c for c in noun.children if c.dep_ in ("nsubj", "nsubjpass") and not _relative(noun, c)]
        noun = subj[0] if subj else noun.head if noun.dep_ in through and noun.head is not noun else None
        if noun is None or noun.pos_ not in ("VERB", "AUX"):  # ("the cat is alert, lying ...": is -> cat)
            break
    return noun


def subject_is_thing(wn, verb) -> bool:
    """The verb's subject (`subject_noun`) is known to be a thing: an artifact, food, plant,
    substance, place or natural object ("a truck sits"), not a person, animal or group."""
    noun = subject_noun(verb)
    words = (noun.doc[noun.i - 1].lower_, wnmod.base_form(wn, noun.lower_, "NOUN")) if noun and noun.i else ()
    if words and wnmod.is_compound(wn, words):  # "a hot dog sitting": the compound's kind (food), not a dog's
        return any(x.lexname() in _THING_LEXNAMES for x in wn.synsets("_".join(words), "n")[:2])  # (hotdog.n.01: a person)
    # "slices of pizza sitting": the thing is the quantity's object
    quantity = noun is not None and wnmod.base_form(wn, noun.lower_, "NOUN") in QUANTITY_NOUNS
    of = [c for c in noun.children if c.lower_ == "of"] if quantity else []
    objs = [c for c in of[0].children if c.dep_ == "pobj"] if of else []
    noun = objs[0] if objs else noun
    return noun is not None and noun_lexname(wn, noun) in _THING_LEXNAMES


def animate_noun(wn, noun, people_only: bool = False) -> bool:
    """Whether a noun is a person or an animal (only a person with people_only) by its most
    frequent WordNet sense, a pronoun a personal one; True when unknown."""
    if wn is None:
        return True
    if noun.pos_ == "PRON":
        return noun.lower_ in ("he", "she", "they", "i", "we", "you", "who", "someone", "somebody", "everyone")
    if noun.pos_ not in ("NOUN", "PROPN"):
        return True
    base = wnmod.base_form(wn, noun.lower_, "NOUN")
    sense = wnmod.most_frequent_sense(wn, base, "NOUN")
    kinds = ("noun.person",) if people_only else ("noun.person", "noun.animal")
    # "person" and "animal" themselves are in noun.Tops; "people", "a couple", "a crowd" are groups of people
    tops = ("person.n.01", *PEOPLE_GROUPS) if people_only else ("person.n.01", "animal.n.01", *PEOPLE_GROUPS)
    objs = [o for c in noun.children if c.lower_ == "of" for o in c.children if o.dep_ == "pobj"]
    if objs and (base in QUANTITY_NOUNS or (sense is not None and sense.lexname() in ("noun.group", "noun.Tops"))):
        return animate_noun(wn, objs[0], people_only)  # "a group of people", "a herd of cows": the members
    return sense is None or sense.lexname() in kinds or sense.name() in tops


def _relative(verb, subj) -> bool:
    """A relative clause's pronoun subject ("a man that has"): the clause's noun is the subject."""
    return verb.dep_ == "relcl" and subj.tag_ in ("WDT", "WP")


def subject_is_animate(wn, verb) -> bool:
    """The verb's subject (`subject_noun`, also through "and" and "to": "a man standing and smiling")
    is known to be a person or an animal, or is a personal pronoun; False when unknown or absent."""
    noun = subject_noun(verb, ("acl", "relcl", "advcl", "conj", "xcomp"))
    if wn is None or noun is None or noun.pos_ not in ("NOUN", "PROPN", "PRON"):
        return False
    known = noun.pos_ == "PRON" or wnmod.most_frequent_sense(wn, wnmod.base_form(wn, noun.lower_, "NOUN"), "NOUN")
    return is_animate_kind(wn, noun) or bool(known) and animate_noun(wn, noun)


def head_is_animate(wn, adj) -> bool:
    """An adjective's noun is known to be a person or animal (not merely unknown)."""
    head = adj.head
    if head is adj or head.pos_ not in ("NOUN", "PROPN") or wn is None:
        return False
    sense = most_frequent_sense(wn, base_form(wn, head.lower_, "NOUN"), "NOUN")
    return sense is not None and sense.lexname() in ("noun.person", "noun.animal")


def is_animate_kind(wn, noun) -> bool:
    """A noun token known (WordNet's most frequent sense) to be a person or an animal."""
    if wn is None or noun.pos_ not in ("NOUN", "PROPN") or noun.lower_ in ("bat", "bats", "mouse"):
        # (WordNet's first "bat" and "mouse" are animals; a photo's are a baseball bat and a computer's)
        return noun.pos_ == "PRON" and noun.lower_ in ("him", "her", "them", "people", "someone")
    words = (noun.doc[noun.i - 1].lower_, base_form(wn, noun.lower_, "NOUN")) if noun.i else ()
    if words and is_compound(wn, words):  # "a baseball bat", "a teddy bear", "a hot dog": the compound's
        return all(x.lexname() in ("noun.person", "noun.animal") for x in wn.synsets("_".join(words), "n")[:2])
    sense = most_frequent_sense(wn, words[1] if words else base_form(wn, noun.lower_, "NOUN"), "NOUN")
    return sense is not None and (sense.lexname() in ("noun.person", "noun.animal")
                                  or sense.name() in ("person.n.01", "animal.n.01", "people.n.01"))
