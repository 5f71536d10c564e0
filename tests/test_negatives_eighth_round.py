"""Issue 21's eighth round (GENERATOR_VERSION 3vl-trees-9): hard negatives a reader would accept.

One test per rule, each on captions written for the test (not taken from a judged sample): joined levels
only of things one sees beside the first noun phrase, no on/at/near swap of a place, the context that
makes a noun or verb replacement absurd or still true, phrasal verbs whose particle is tagged a
preposition, a verb's subject through "and", and closed-domain (scene) generators left as they were.
"""

from __future__ import annotations

import pytest

from tree_helpers import missed as _missed
from tree_helpers import needs_wordnet, prepared_generator
from tree_helpers import replaced as _replaced
from vlctl.captions import levels as level_builder
from vlctl.captions import parse, subjects
from vlctl.captions.trees import GENERATOR_VERSION, TreeGenerator

pytestmark = needs_wordnet


@pytest.fixture(scope="module")
def gen():
    return prepared_generator()


def _levels(gen, caption):
    return [lv["positive"] for lv in gen.tree(caption)]


def _negatives(gen, caption):
    return {neg for lv in gen.tree(caption) for neg in lv["negatives"]}


def test_version():
    assert GENERATOR_VERSION == "3vl-trees-9"


def test_joined_levels_only_of_things_beside_the_first_phrase(gen):
    # a garment worn, a marking one has, what one poses for, a time, an act, a body part, a colour of clothes
    for caption, joined in [("A girl in a yellow raincoat next to a bus", "A girl and a yellow raincoat"),
                            ("A woman wearing a red dress near a car", "A woman and a red dress"),
                            ("A cow with white spots standing in a pasture", "A cow and white spots"),
                            ("A man posing for a photo beside a truck", "A man and a photo"),
                            ("A dog and a cat on a rainy day", "A dog and a rainy day"),
                            ("Two boys playing a game of chess at a table", "Two boys and a game of chess"),
                            ("A man with his hands on a laptop", "A man and his hands"),
                            ("A kid in blue on a bicycle", "A kid and blue")]:
        levels = _levels(gen, caption)
        assert joined not in levels, (caption, levels)
        assert levels[-1] == caption
    # a thing beside the first phrase still joins it, a compound read as its compound ("traffic light", not light)
    assert "A woman and red traffic lights" in _levels(gen, "A woman standing at red traffic lights with a bag")
    assert "A man and a truck" in _levels(gen, "A man posing for a photo beside a truck")
    assert "A woman and a car" in _levels(gen, "A woman wearing a red dress near a car")
    # the words of a skipped level get their negatives at the next level: none is lost
    assert "A girl in a pink raincoat" in _negatives(gen, "A girl in a yellow raincoat next to a bus")
    # "a close up of": no phrase "a close"
    assert _levels(gen, "A close up of a dog near a fence")[0] == "a dog"
    wn = gen.wn_
    doc = gen.nlp_("a man in a black suit")
    assert not level_builder.joins_as_entity(wn, doc, (3, 6))
    doc = gen.nlp_("a man holding a black suit")
    assert level_builder.joins_as_entity(wn, doc, (3, 6))


def test_no_on_at_near_swap_of_a_place(gen):
    for caption, word in [("A family having a picnic on a beach", "on"), ("Two teams at the stadium", "at"),
                          ("A bench near a lake", "near"), ("A man walking his horse on a trail", "on")]:
        assert not _replaced(gen, caption, word), caption
        assert _missed(gen, caption)[word].startswith("no false contrast for"), caption
        assert _missed(gen, caption)[word].endswith(parse.SECOND_CANDIDATE)
    # a thing keeps its contrasts; a person on a thing, also when a pronoun or "one" says who
    assert _replaced(gen, "A cat sitting on a table", "on")
    assert _replaced(gen, "Two men, one on a bench and one standing", "on") == {"beside"}


def test_context_makes_a_replacement_absurd_or_still_true(gen):
    # a counted ball is no sport; the sport is
    assert not _replaced(gen, "A pitcher throws a baseball to the batter", "baseball")
    assert _replaced(gen, "This man is playing tennis", "tennis")
    # the fixtures of a room the caption names, and another room's fixtures
    assert not _replaced(gen, "A kitchen with a stove and a refrigerator", "stove")
    assert not _replaced(gen, "A small bathroom with a white sink", "sink")
    assert not {"toilet", "shower", "bathtub", "mirror"} & _replaced(gen, "A stove next to a sink", "sink")
    # an owned animal becomes a pet, water that a boat floats on or a glass holds is not land
    assert _replaced(gen, "A man walking his horse on a trail", "horse") <= {"dog", "cat", "puppy", "kitten", "pony"}
    assert not _replaced(gen, "A ferry on the water", "water")
    assert _replaced(gen, "A horse and the water", "water")
    # swimming over a river, walking over water, another time "at", "balls" for a plural
    assert not _replaced(gen, "A hawk flying over the river", "flying")
    assert not _replaced(gen, "A man skating at night", "night")
    assert "balls" not in _replaced(gen, "A girl holding skis", "skis")
    # "with" a counted object: "a table without three chairs" is no caption
    assert _missed(gen, "A table with three chairs")["with"].startswith("counted object")


def test_verbs_phrasal_floating_and_subject_through_and(gen):
    assert _missed(gen, "Children watch while the coach looks on")["looks"].startswith("verb of a phrasal verb")
    assert _missed(gen, "Geese sitting in the lake")["sitting"].startswith("posture in water")
    assert not _replaced(gen, "A kid posing for the camera", "camera")
    # the subject of a verb joined by "and" is the first verb's: a clock neither reads nor writes
    doc = gen.nlp_("a large clock hangs from a building and reads noon")
    reads = next(t for t in doc if t.lower_ == "reads")
    assert not subjects.animate_subject(gen.wn_, reads)
    doc = gen.nlp_("a man sits on a bench and reads a book")
    assert subjects.animate_subject(gen.wn_, next(t for t in doc if t.lower_ == "reads"))


def test_closed_domains_keep_their_trees():
    # a scene generator (a vocabulary) does not take the eighth round's rules: "on" a sphere keeps "under"
    vocab = {"a", "and", "red", "blue", "cube", "sphere", "on", "under", "near", "of"}
    g = TreeGenerator(vocabulary=vocab, seed=0)
    assert [r[1] for lv in g.tree("a red cube on a blue sphere", details=True) for r in lv["replaced"] if r[0] == "on"]
