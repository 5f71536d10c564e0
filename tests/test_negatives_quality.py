"""Issue 21's reproductions: tree negatives a reader accepts, input normalisation, Anchor on English.

Every defect the issue lists on COCO-style captions is pinned here, with the caption it was found
on. (The shares over the whole COCO test split are measured by experiments/trees_quality.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vlctl.io import VlctlError
from vlctl.methods import caption_parse as parse
from vlctl.methods import wordnet as wnmod
from vlctl.methods.anchor import anchor_text
from vlctl.methods.negatives import article_for, inflect_like, normalize_caption, zipf
from vlctl.methods.trees import TREE_POS, TreeGenerator, caption_tree

pytestmark = pytest.mark.skipif(not Path(wnmod.DEBIAN_DIR, "data.noun").is_file(),
                                reason="WordNet database not installed (Debian package wordnet-base)")


@pytest.fixture(scope="module")
def gen():
    return TreeGenerator()


def _negs(gen, caption):
    return [(lv["positive"], neg, r) for lv in gen.tree(caption, details=True)
            for neg, r in zip(lv["negatives"], lv["replaced"])]


def _words(text):
    return re.findall(r"[A-Za-z]+", text.lower())


def test_preposition_swaps_keep_grammar(gen):
    # in -> out made "two giraffes out a zoo"; "of" was replaced ("a couple onto dogs");
    # "posing for a picture" -> "posing from a picture"
    negs = _negs(gen, "two giraffes in a zoo")
    assert not any(" out a zoo" in n for _, n, _ in negs)
    assert [r[1] for _, _, r in negs if r[0] == "in"] in (["near"], ["outside"], ["beside"])
    for cap in ("a couple of dogs on a lawn", "a man posing for a picture", "a plate of food"):
        tree = gen.tree(cap, details=True)
        assert not any(r[0] in ("of", "for") for lv in tree for r in lv["replaced"])
        missed = {m[0]: why for lv in tree for m, why in zip(lv["missed"], lv["missed_reason"])}
        assert any(w in missed for w in ("of", "for"))
    tree = gen.tree("a couple of dogs on a lawn", details=True)
    assert tree[0]["positive"] == "a couple of dogs"  # a quantity phrase is one noun phrase
    # phrasal-verb particles and prepositions that make a phrasal verb are never replaced
    assert not any(r[0] == "up" for lv in gen.tree("a man picking up a ball", details=True) for r in lv["replaced"])
    assert not any(r[0] == "onto" for lv in gen.tree("A woman holding onto a pink bag", details=True)
                   for r in lv["replaced"])


@pytest.mark.parametrize("caption,word,bad", [
    ("a glass of water on a table", "water", {"hydride"}),
    ("a sandwich on a plate", "plate", {"third"}),
    ("a white sink in a bathroom", "sink", {"source"}),
    ("a bus on the street", "street", {"artery"}),
    ("a kite in the blue sky", "sky", {"fluorine"}),
    ("a red flower in a vase", "flower", {"dicot"}),
    ("a fire hydrant on the sidewalk", "fire", {"collapse"}),
    ("a couple sitting on a bench", "couple", {"yoke"}),
    ("a man wearing a hat", "wearing", {"bearing"}),
    ("a bird in a bush", "bush", {"bramble"}),
    ("a dog on a blanket", "blanket", {"quilt"}),
    ("a red bus", "bus", {"car"}),
    ("a man sitting on a bench", "bench", {"table"}),
    ("a group of people", "group", {"set"}),
])
def test_wrong_sense_obscure_synonym_and_hypernym_replacements_are_gone(gen, caption, word, bad):
    got = {r[1] for _, _, r in _negs(gen, caption) if word in r[0].lower().split()}
    assert not got & bad, got
    for _, _, r in _negs(gen, caption):
        assert zipf(r[1]) >= 3.0, r  # no word a reader stops at


def test_word_forms_and_articles(gen):
    assert [r[1] for _, _, r in _negs(gen, "the opened refrigerator") if r[0] == "opened"] == ["closed"]
    assert [r[1] for _, _, r in _negs(gen, "a lit sign") if r[0] == "lit"] == ["dark"]
    assert not any(r[1] == "sit" for _, _, r in _negs(gen, "a fruit stand"))  # the noun is no verb
    for cap in ("a boy hides behind a tree", "the sun rises over the hills", "a man breaks a board"):
        for _, neg, _ in _negs(gen, cap):
            assert all(zipf(w) > 0 for w in _words(neg)), neg  # no "hided", "rised", "breaked"
    assert inflect_like("hide", "VBD", "VERB") == "hid" and inflect_like("rise", "VBZ", "VERB") == "rises"
    assert inflect_like("dark", "VBN", "VERB") is None  # no made-up verb forms
    # a/an agree with the new word: "an old man" -> "a young man" ("a young photo" is nonsense: "young"
    # is only for people and animals), "a person" -> "an animal"
    assert "a young man" in [n for _, n, _ in _negs(gen, "an old man")]
    assert "a new photo" in [n for _, n, _ in _negs(gen, "an old photo")]
    assert "an animal" in [n for _, n, _ in _negs(gen, "a person")]
    assert article_for("umbrella") == "an" and article_for("unicorn") == "a"
    for cap in ("an old man holding an umbrella", "a person eating an apple", "an elephant near a tree"):
        for _, neg, _ in _negs(gen, cap):
            for a, nxt in re.findall(r"\b(an?) ([a-z]+)", neg.lower()):
                assert article_for(nxt) == a, neg


def test_compounds_and_hyphenated_words_are_one_unit(gen):
    tree = gen.tree("a fire hydrant on the sidewalk", details=True)
    assert "a fire" not in [lv["positive"] for lv in tree]
    assert tree[0]["positive"] == "a fire hydrant"
    assert not any(r[0] == "fire" for lv in tree for r in lv["replaced"])
    for cap in ("a man holding a tennis racket", "a boy eating a hot dog", "a man talking on a cell phone"):
        t = gen.tree(cap, details=True)
        for lv in t[:-1]:
            assert not re.search(r"\b(tennis|hot|cell)$", lv["positive"]), lv["positive"]
    tree = gen.tree("a man with a long-haired dog", details=True)
    for lv in tree:
        for neg in lv["negatives"] if "long-haired" in lv["positive"] else []:
            assert "long-haired" in neg, neg  # the hyphenated word is never cut ("long-silver")


def test_input_normalisation_is_recorded(gen):
    tree = gen.tree("ring and ON finger", details=True)
    assert all("ON" not in lv["positive"].split() for lv in tree)
    assert tree[-1]["normalized"] == {"from": "ring and ON finger", "steps": ["all_caps"]}
    tree = caption_tree("a man &amp; a dog")
    assert all("amp" not in _words(t) for lv in tree for t in [lv["positive"], *lv["negatives"]])
    assert tree[-1]["normalized"]["steps"] == ["html_entities"]
    tree = gen.tree("a dog\non a\tcouch\u00a0outside\n")
    for lv in tree:
        for t in [lv["positive"], *lv["negatives"]]:
            assert not re.search("[\t\n\u00a0]", t), repr(t)
    assert tree[-1]["positive"] == "a dog on a couch outside"
    text, steps = normalize_caption("<b>A cat</b> \u200bon a mat 😀 https://x.org/a.jpg")
    assert text == "A cat on a mat" and steps == ["html_tags", "urls", "zero_width", "symbols", "whitespace"]
    assert normalize_caption("A man. ") == ("A man. ", [])  # a clean caption stays verbatim


@pytest.mark.parametrize("bad,match", [
    ("<b></b> <i> </i>", "empty once markup"),
    ("😀😀 🎉", "empty once markup"),
    ("https://example.com/cat.jpg", "empty once markup"),
    ("12345 678", "no words"),
])
def test_markup_only_and_number_only_captions_are_one_clear_error(gen, bad, match):
    with pytest.raises(VlctlError, match=match):
        gen.tree(bad)


def test_propn_repair_and_every_word_without_negative_is_listed(gen):
    from vlctl.methods.negatives import get_nlp

    caps = ["a white surfboard on the sand", "a couple of dogs on a lawn", "a man posing for a picture",
            "Two men walk down the street", "A pizza sitting on top of a pizza box", "a fire hydrant on the street"]
    for cap in caps:
        tree = gen.tree(cap, details=True)
        covered = " ".join(w for lv in tree for w in [r[0] for r in lv["replaced"]] + [m[0] for m in lv["missed"]])
        assert all(len(lv["missed"]) == len(lv["missed_reason"]) and all(lv["missed_reason"]) for lv in tree)
        for tok in get_nlp()(cap):
            if tok.is_alpha and tok.pos_ in (*TREE_POS, "PROPN") and tok.lower_ not in ("is", "are"):
                assert tok.text in covered.split(), (cap, tok.text)
    tree = gen.tree("a white surfboard on the sand", details=True)
    assert any(r[0] == "white" and r[2] == "ADJ" for lv in tree for r in lv["replaced"])


def test_pos_overrides():
    default = TreeGenerator(use_wordnet=False)
    forced = TreeGenerator(use_wordnet=False, pos_overrides={"striped": "ADJ", "dotted": "ADJ"},
                           opposites={"striped": ["dotted"], "dotted": ["striped"]})
    tree = forced.tree("a large striped cube left of a small dotted sphere", details=True)
    rep = {r[0]: r for lv in tree for r in lv["replaced"]}
    assert rep["striped"][1:3] == ["dotted", "ADJ"] and rep["dotted"][1:3] == ["striped", "ADJ"]
    # without overrides the generator is unchanged (and the two never share cache keys)
    assert default.tree("a red car") == TreeGenerator(use_wordnet=False).tree("a red car")
    assert forced.cache_key("a red car") != default.cache_key("a red car")
    with pytest.raises(VlctlError, match="pos_overrides"):
        TreeGenerator(pos_overrides={"striped": "adjective"}).tree("a cat")


def test_anchor_accepts_english_and_swaps_have_two_different_sides():
    assert anchor_text("bare hand", "stained hand") == "bare hand or stained hand"
    assert anchor_text("blue sky", "teal sky") == "blue sky or teal sky"
    p, n = "A pizza sitting on top of a pizza box", "A pizza box sitting on top of a pizza"
    assert anchor_text(p, n) == f"{p} or {n}"
    a = anchor_text("a cat to the left of a dog", "a dog to the left of a cat")
    left, right = a.split(" or ")
    assert left != right and left.split()[-1] not in ("of", "a", "the", "to")
    assert anchor_text("a person", "an animal") == "a person or an animal"  # a tree's first level
    with pytest.raises(VlctlError, match="every word"):
        anchor_text("a red car", "two blue buses")


def _missed(gen, caption):
    return {m[0]: why for lv in gen.tree(caption, details=True) for m, why in zip(lv["missed"], lv["missed_reason"])}


def _replaced(gen, caption, word):
    return {r[1] for _, _, r in _negs(gen, caption) if r[0] == word}


def test_second_round_levers_fix_classes_of_bad_negatives(gen):
    # the judged sample of seed 2101 (experiments/trees_judged_2101.json): one reproduction per class
    assert "head of the noun compound" in _missed(gen, "A computer desk topped with a large monitor.")["desk"]
    assert not _replaced(gen, "A black and white photo of a train", "white")  # the photo's style
    assert _replaced(gen, "a black and white cat on a couch", "white")  # a coat's colours are swapped
    assert _replaced(gen, "A woman standing outside under a pink umbrella.", "under") == {"beside"}
    assert _missed(gen, "A child smiling and skiing in the snow.")["in"].startswith("no false contrast")
    assert _missed(gen, "A woman holding a cell phone in her hand.")["in"].startswith("no false contrast")
    assert _missed(gen, "A small sandwich with lettuce on it.")["on"].startswith("pronoun object")
    assert _missed(gen, "A truck sits in front of a tree line")["sits"].startswith("posture verb of a thing")
    assert _replaced(gen, "A man sits on a bench", "sits")  # people's posture is a contrast
    assert _missed(gen, "A table with a glass that is half full")["full"] == "idiom 'half full'"
    assert _replaced(gen, "A little girl standing on a lush green field.", "green") <= {"brown", "white", "gray"}
    assert _replaced(gen, "a yellow banana on a table", "yellow") == {"green"}  # plant colours: no purple bananas
    assert _replaced(gen, "a brown dog on a couch", "brown") <= {"black", "white", "gray"}  # no green dogs
    assert _replaced(gen, "A bird is perched on a wooden rail", "wooden") <= {"metal", "plastic", "stone"}
    assert "cars" not in _replaced(gen, "A couple of large long trains on a track.", "trains")
    for caption, word, bad in [("The bicycle is leaning on a pole on the street.", "pole", "baton"),
                               ("Some people are standing on rocks", "rocks", "bodies"),
                               ("A statue sitting by the road", "statue", "carving"),
                               ("Two skateboarders sit on a ledge", "ledge", "reef")]:
        assert bad not in _replaced(gen, caption, word), (caption, word)
    assert wnmod.mfs_co_hyponyms(wnmod.load_wordnet(), "pole", "NOUN") == ()  # 6 of 12 tagged uses: no sense


def _level(gen, caption, k):
    lv = gen.tree(caption, details=True)[k]
    return lv["positive"], [r[:2] for r in lv["replaced"]]


def test_third_round_modifiers_must_fit_the_new_noun(gen):
    # seed 2103's bad class "noun swap keeps a modifier that no longer fits": the modifier is swapped
    assert _level(gen, "The blue bird is on a branch of a tree.", 0) == ("The blue bird", [["blue", "white"]])
    assert not _replaced(gen, "A man riding a tusked elephant by a shallow river", "elephant")  # "tusked giraffe"
    assert not _replaced(gen, "A man riding a tusked elephant by a shallow river", "river")  # "shallow street"
    assert _replaced(gen, "A man riding a tusked elephant by a shallow river", "shallow") == {"deep"}
    assert not _replaced(gen, "A grilled meat, lettuce, and tomato sandwich on a cutting board.", "meat")
    assert _level(gen, "Small child with white clothes on riding on top of a horse. ", 0) == (
        "Small child", [["Small", "large"]])  # not "small adult": the noun's age changes under a size word
    # free adjectives and coat colours fit: "a black dog" -> "a black giraffe"; artifacts take any modifier
    assert _level(gen, "a black dog is sleeping on a couch", 0) == ("a black dog", [["black", "brown"], ["dog", "giraffe"]])
    assert _level(gen, "A rustic boat on a lake", 0) == ("A rustic boat", [["boat", "bicycle"]])
    assert parse.morphological_antonym("covered", "uncovered") and parse.morphological_antonym("colorless", "colorful")
    assert not parse.morphological_antonym("wet", "dry")


def test_third_round_adjectives_antonyms_and_verbs(gen):
    assert _level(gen, "A young girl stands on a refrigerator and smiles.", 0) == ("A young girl", [["girl", "boy"]])
    assert not _replaced(gen, "A young boy is flying a colorful kite near two other people.", "colorful")
    assert not _replaced(gen, "A couple of birds sitting on a grass covered field.", "covered")
    assert not _replaced(gen, "Tree is spreading its pollen in the winter.", "spreading")  # no verb antonym of a thing
    assert not _replaced(gen, "A zebra with its head down and a giraffe in the background eating from a tree",
                         "eating")  # "sleeping from a tree"
    assert _replaced(gen, "Three cows are eating food", "eating") == {"smelling"}  # an animal's transitive verb
    assert _replaced(gen, "A person is riding a bicycle", "riding") == {"pushing"}  # "person" is a person
    assert _replaced(gen, "Two dogs are playing on the beach", "playing") == {"sitting"}
    assert _replaced(gen, "a black dog is sleeping on a couch", "sleeping") == {"eating"}  # never "grazing"
    assert _missed(gen, "Four boxes full of black and yellow chicks")["full"] == "adjective with a complement"
    assert _missed(gen, "An old fashion red car is parked on a moving boat. ")["old"].startswith(
        "adjective before the noun modifier")
    assert _missed(gen, "Slices of pizza sitting on a table")["sitting"].startswith("posture verb of a thing")


def test_third_round_prepositions(gen):
    assert _replaced(gen, "A picture of a man sitting on a bench with a tree.", "on") == {"beside"}
    assert _replaced(gen, "A bathroom sink sitting underneath a bathroom mirror.", "underneath") == {"above"}
    assert _missed(gen, "Various wild animals stand near each other in a lightly wooded area.")["near"] == (
        "reciprocal object 'near each other'")
    assert _missed(gen, "Mobile phone with Asian writing on display area")["on"] == "idiom 'on display'"
    assert _missed(gen, "A train wreck with cars submerged in water. ")["with"] == "part of its head 'wreck with cars'"
    assert _missed(gen, "A group of giraffes feeding on a bunch of hay")["on"] == "phrasal verb 'feeding on'"
    assert _replaced(gen, "A dog sitting by a car", "by") == {"behind"}
    assert _missed(gen, "A cart pulled by horses")["by"] == "'by' of a passive agent"


def test_third_round_levels_number_and_stays_true(gen):
    # "X of Y" is one phrase; a noun the parser left outside the chunk joins it
    assert [lv["positive"] for lv in gen.tree("a small party of people eats some pizza on a table")][:2] == [
        "a small party of people", "a small party of people and some pizza"]
    assert gen.tree("A baseball player wearing a catchers mitt on a field.")[1]["positive"] == (
        "A baseball player and a catchers mitt")
    assert gen.tree("A motorcycle parked in front of a truck")[1]["positive"] == "A motorcycle and a truck"
    assert _replaced(gen, "A pile of broccoli sitting next to other vegetables.", "broccoli") == {"carrots"}
    assert _replaced(gen, "A man is walking a herd of sheep down a street.", "sheep") == {"cattle"}
    assert _replaced(gen, "Seven giraffe standing in a field", "giraffe") == {"zebras"}
    # a noun of the rest of the caption stays true of the image: "a sign" -> "a clock" of "... a wall clock"
    assert _replaced(gen, "A sign showing the Seeley Stable Museum hours below a wooden wall clock.", "sign") == {"lamp"}
    assert _replaced(gen, "A woman throwing a frisbee outside at a park. ", "park") == {"street"}  # not "city"


def test_third_round_leaves_scene_trees_unchanged():
    # the shipped scenes fine-tunes were trained on these trees (issue 21: none of the levers may move them)
    from vlctl.data.scenes import SCENE_OPPOSITES, vocabulary

    g = TreeGenerator(seed=0, opposites=SCENE_OPPOSITES, vocabulary=set(vocabulary()))
    tree = g.tree("a large green plain circle right of a small red plain cross")
    assert [(lv["positive"], lv["negatives"]) for lv in tree] == [
        ("a large green plain circle", ["a small green plain circle", "a large yellow plain circle",
                                        "a large green striped circle", "a large green plain square"]),
        ("a large green plain circle right of a small red plain cross",
         ["a large green plain circle right of a large red plain cross",
          "a large green plain circle right of a small purple plain cross",
          "a large green plain circle right of a small red plain square"])]
    tree = g.tree("a large purple plain circle left of a large blue dotted star and a large green striped circle")
    assert [lv["positive"] for lv in tree] == [
        "a large purple plain circle", "a large purple plain circle and a large blue dotted star",
        "a large purple plain circle left of a large blue dotted star",
        "a large purple plain circle left of a large blue dotted star and a large green striped circle"]
    assert tree[2]["negatives"] == ["a large purple plain circle right of a large blue dotted star"]


def test_third_round_objects_people_and_participles(gen):
    # seed 2105's first reading: "dropping young girls", "swings his racket under the court", "riding
    # under people", "a horse holding a scarf", "a piece of bananas", "a snow emptied hill"
    assert not _replaced(gen, "Woman holding young girls", "holding")  # a person object: no throw/drop
    assert _replaced(gen, "A man swings his racket on the court", "on") == {"beside"}  # a verb's "on": beside
    assert _replaced(gen, "A man riding on a motorcycle near people", "near") == {"behind"}
    assert _replaced(gen, "a cat on a table", "on") == {"under"}  # a thing's place keeps on/under
    assert not _replaced(gen, "A hitched white horse wearing a blue scarf.", "wearing")
    assert not _replaced(gen, "A cat sitting on a sill looking out a window.", "looking")  # cats do not point
    assert _replaced(gen, "A baby in a high chair and a piece of broccoli", "broccoli") == {"orange"}
    assert not _replaced(gen, "A person riding skis and a snow filled hill", "filled")  # no participle antonym
    assert _replaced(gen, "a tall green tree in a park", "green") == {"brown"}  # a plant's colours

