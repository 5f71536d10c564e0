"""Issue 21's reproductions: tree negatives a reader accepts, input normalisation, Anchor on English.

Every defect the issue lists on COCO-style captions is pinned here, with the caption it was found
on. (The shares over the whole COCO test split are measured by experiments/trees_quality.py.)
"""

from __future__ import annotations

import re

import pytest

from vlctl.captions import wordnet
from vlctl.captions import wordnet as wnmod
from vlctl.captions.anchor import anchor_text
from vlctl.captions.inflection import article_for, inflect_like
from vlctl.captions.negatives import zipf
from vlctl.captions.text import normalize_caption
from vlctl.captions.trees import TREE_POS, TreeGenerator, caption_tree
from vlctl.fsops import VlctlError

pytestmark = pytest.mark.needs_wordnet


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
    from vlctl.captions.text import get_nlp

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
    # not "small adult" (the noun's age changes under a size word), and since the fifth round not
    # "large child" either (no size swap of a young one: "a big girl" reads odd)
    assert _level(gen, "Small child with white clothes on riding on top of a horse. ", 0) == ("Small child", [])
    # free adjectives and coat colours fit: "a black dog" -> "a black giraffe"; artifacts take any modifier
    assert _level(gen, "a black dog is sleeping on a couch", 0) == ("a black dog", [["black", "brown"], ["dog", "giraffe"]])
    assert _level(gen, "A rustic boat on a lake", 0) == ("A rustic boat", [["boat", "bicycle"]])
    assert wordnet.morphological_antonym("covered", "uncovered") and wordnet.morphological_antonym("colorless", "colorful")
    assert not wordnet.morphological_antonym("wet", "dry")


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
    # (eighth round: a garment worn is no joined level, "a player and a catchers mitt"; the prefix keeps the unit)
    assert gen.tree("A baseball player wearing a catchers mitt on a field.")[1]["positive"] == (
        "A baseball player wearing a catchers mitt")
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



def test_fourth_round_prepositions_need_a_concrete_object_and_a_place_reading(gen):
    # abstract objects (acts, events, times: the first two WordNet senses) have no near/outside
    assert _missed(gen, "Two boys playing in a soccer game")["in"].startswith("abstract object")
    assert _replaced(gen, "A man with a basketball", "with") == {"without"}  # a second sense is a thing
    assert _replaced(gen, "A man with a tennis racket", "with") == {"without"}  # the compound's sense
    # a clause, not a noun, after the preposition; a hyphenated object's head ("mid-air" -> air)
    assert _missed(gen, "A girl leans in reading on a bench")["in"] == "preposition without a noun object"
    assert _missed(gen, "A bird flying in mid-air")["in"].startswith("no false contrast")
    # verb + preposition of what the verb acts on, wherever the verb is; garments of a verb
    for caption in ("A chef spreading butter on the bread", "A man talking on a cell phone",
                    "A man pulling on his boots", "A woman dressed in a long coat"):
        assert _missed(gen, caption)["in" if "dressed" in caption else "on"].startswith(
            "argument of the verb"), caption
    assert _missed(gen, "A bus parked on the highway")["on"].endswith("(a road)")
    assert _missed(gen, "A plane flying over a green field")["over"].endswith("(a place below)")
    assert _replaced(gen, "A lamp over a table", "over") == {"under"}
    assert _missed(gen, "A team of kids standing in a long line")["in"].startswith("arrangement")
    assert _missed(gen, "A poster with a girl on the front")["on"].startswith("position object")
    # a person is on what carries him: "beside", never "under"; a cat on a table may be under it
    assert _replaced(gen, "A woman on a bench", "on") == {"beside"}
    assert _replaced(gen, "a cat on a table", "on") == {"under"}
    # directions a photo does not show
    assert not _replaced(gen, "A man riding his bike down the street", "down")
    assert not _replaced(gen, "A man walking across the street", "across")


def test_fourth_round_relation_phrases_are_replaced_whole(gen):
    # by a phrase that differs in one word (every negative changes one word of the positive)
    assert _replaced(gen, "A man standing in front of a bus", "in front of") == {"in back of"}
    assert _replaced(gen, "A cat inside of a box", "inside of") == {"outside of"}
    assert _replaced(gen, "A bear on the back of a truck", "on the back of") == {"on the front of"}
    assert _replaced(gen, "A man at the top of the stairs", "at the top of") == {"at the bottom of"}
    assert not _replaced(gen, "Two giraffes standing in front of each other", "in front of")  # reciprocal
    assert not _replaced(gen, "A man standing in front of him", "in front of")  # a pronoun
    tree = gen.tree("A man standing in front of a bus", details=True)
    assert "A man standing in back of a bus" in tree[-1]["negatives"]
    assert tree[-1]["negative_pos"][tree[-1]["negatives"].index("A man standing in back of a bus")] == "ADP"
    # a level that holds only part of the phrase ("X and the back of a truck") leaves it to the next
    tree = gen.tree("A bear sitting on the back of a truck", details=True)
    assert not any("front" in n for lv in tree[:-1] for n in lv["negatives"])
    assert "A bear sitting on the front of a truck" in tree[-1]["negatives"]


def test_fourth_round_adjectives_fixed_phrases_and_fit(gen):
    assert _missed(gen, "An upside down boat on the beach")["down"] == "fixed phrase 'upside down'"
    # "black and white" is the picture's style wherever the picture noun stands; a cat's colours are not
    assert not _replaced(gen, "An old black and white family photo", "white")
    assert _replaced(gen, "a black and white cat on a couch", "white")
    # open/closed only for things that open
    assert not _replaced(gen, "A deer in an open field", "open")
    # age words on a noun a young one modifies: "her old, baby giraffe" is not a negative
    assert not _replaced(gen, "A young, baby giraffe", "young")
    assert _replaced(gen, "A small dog on a bed", "small") == {"large"}
    assert _replaced(gen, "A clear blue sky", "clear") == {"cloudy"}


def test_fourth_round_verbs_and_nouns(gen):
    # a posture verb of a thing: through the verb it hangs on, and a compound's kind ("hot dog" is food)
    assert _missed(gen, "A salad topped with cheese sitting on a table")["sitting"].startswith("posture verb")
    assert _missed(gen, "A hot dog sitting on a plate")["sitting"].startswith("posture verb")
    assert _replaced(gen, "A dog sitting on a couch", "sitting") == {"standing"}
    assert _missed(gen, "the running water of a sink")["running"] == "participle of a thing"
    assert _replaced(gen, "a running man", "running")
    # animals may be fed or petted; bikes and teddy bears not
    assert _replaced(gen, "A man holding a dog", "holding") == {"petting"}
    assert _replaced(gen, "A man riding a bike", "riding") == {"pushing"}
    assert not _replaced(gen, "A woman holding a teddy bear", "holding") & {"feeding", "petting"}
    # nouns: "a pair of", "a body of water", plurals with their own sense, a compound's outer modifier
    assert _missed(gen, "A man and a pair of shoes")["shoes"] == "object of 'a pair of'"
    assert _missed(gen, "A lake and a body of water")["water"].startswith("part of the compound")
    assert not _replaced(gen, "A woman wearing glasses", "glasses")
    assert _replaced(gen, "A man and a glass of wine", "glass")
    assert _missed(gen, "A kitchen remote control")["control"].startswith("head of the noun compound")


def test_fourth_round_groups_of_people_and_compound_objects(gen):
    # "people", "a couple", "a group of children" are people: their verbs get people's contrasts
    assert _replaced(gen, "Two people riding a motorcycle", "riding") == {"pushing"}
    assert _replaced(gen, "A group of children playing baseball", "playing") == {"watching"}
    assert _replaced(gen, "A group of people walking down the street", "walking")
    # ... but no WordNet verb antonym of what a group does ("people gather" -> "people spread")
    assert not _replaced(gen, "Many people gather around a building", "gather")
    # an object is the compound it heads: a baseball bat and a hot dog are things, not animals
    assert _replaced(gen, "A man holding a baseball bat", "holding") == {"dropping"}
    assert _replaced(gen, "A man eating a hot dog", "eating") <= {"cutting", "holding"}
    assert _replaced(gen, "A man eating a hot dog", "eating")


def test_fourth_round_colour_and_size_words_are_not_compound_modifiers(gen):
    # WordNet's "white horse" (a whitecap), "blue sky", "black cat": a caption means a horse that is white
    assert _replaced(gen, "A man leading a white horse", "white")
    assert _replaced(gen, "A kite in the clear blue sky", "blue")
    # the curated compounds stay units ("hot dog"), and a noun compound after a colour is one ("fire hydrant")
    assert not _replaced(gen, "A man eating a hot dog", "hot")
    assert gen.tree("A red fire hydrant on a sidewalk")[0]["positive"] == "A red fire hydrant"


def test_fourth_round_more_contrasts_for_frequent_words(gen):
    assert _replaced(gen, "A cat sleeping on the floor", "floor") == {"table"}
    assert _replaced(gen, "A man kicking a ball", "kicking") == {"catching"}
    assert _replaced(gen, "A rainy street in the city", "rainy") == {"sunny"}
    assert _replaced(gen, "A plane on the runway", "runway") == {"road"}
    # (eighth round: a place one is at is one is near, "people near the beach" is not clearly false)
    assert _missed(gen, "People at the beach")["at"].startswith("no false contrast for 'at beach' (a place")
    assert not _replaced(gen, "A man looking at the beach", "at")  # what one looks at
    assert not _replaced(gen, "Cars at twilight", "at")  # a time
    assert _replaced(gen, "Some elephants standing in the middle of a field", "in the middle of") == {"in the corner of"}
    assert not _replaced(gen, "A car in the middle of the road", "in the middle of")  # a road has no corner
    assert not _replaced(gen, "A zebra in the middle of some giraffes", "in the middle of")


def test_fourth_round_a_pair_of_animals_is_two_animals(gen):
    assert _missed(gen, "A man and a pair of shoes")["shoes"] == "object of 'a pair of'"
    assert _replaced(gen, "A pair of zebras in a field", "zebras")  # "a pair of horses" is a fine negative
    assert not _replaced(gen, "A dog licking at the window", "at")  # what a verb acts at
    assert not _replaced(gen, "Three boys playing a video game at home", "at")  # a bare idiom
    assert not _replaced(gen, "A man sitting on a bench in front of the ocean", "in front of")  # no back of the sea


def test_fifth_round_noun_compounds_the_parser_read_as_verbs(gen):
    # a verb that is a preposition's object, or a VBZ after a counted singular, is a compound's head
    assert _missed(gen, "A cat sleeping on a brick side walk")["walk"].startswith("head of the noun compound")
    assert gen.tree("Three donut holes on a plate")[0]["positive"] == "Three donut holes"
    # a verbless caption's root noun after a subject ("an airplane flies", "a zebra grazing") is its verb
    assert [lv["positive"] for lv in gen.tree("A jet airplane flies in a cloudy sky")][:2] == [
        "A jet airplane", "A jet airplane and a cloudy sky"]
    assert gen.tree("A zebra grazing in a field")[0]["positive"] == "A zebra"
    # ... not a counted plural ("two carriage horses" are horses) nor a noun compound WordNet knows
    assert gen.tree("Two white carriage horses in a field")[0]["positive"] == "Two white carriage horses"
    assert gen.tree("Some fruit flies on a banana")[0]["positive"].startswith("Some fruit flies")
    # "light" before a noun is a noun modifier or a weight ("a light pole"), a colour's shade before a colour
    assert _missed(gen, "A light pole near a street")["light"].startswith("noun modifier or weight")
    assert _replaced(gen, "A light blue car on a street", "light") == {"dark"}


def test_fifth_round_joined_levels_after_a_verb_join_noun_phrases(gen):
    # "a man holding an umbrella and a dog" reads as holding a dog: the subject and the new phrase instead
    levels = [lv["positive"] for lv in gen.tree("A man holding an umbrella with a dog")]
    assert "A man and a dog" in levels and "A man holding an umbrella and a dog" not in levels
    assert "A man and an umbrella" in levels  # (the first join has no verb before it)
    levels = [lv["positive"] for lv in gen.tree("A cat on a couch with a pillow")]
    assert "A cat on a couch and a pillow" in levels  # no verb: the prefix is joined as before


def test_fifth_round_prepositions_of_surfaces_boards_and_body_parts(gen):
    # a thing on a wall or a pole is near it (no contrast), a cat sitting on a wall is not
    assert _missed(gen, "A painting on the wall of a room")["on"].startswith("vertical surface")
    assert _missed(gen, "A cat sitting on a wall")["on"].startswith("no false contrast")  # (eighth round: near it)
    # what one rides or surfs on: "riding waves beside a surfboard" is absurd; a place still swaps
    assert _missed(gen, "A man surfing a wave on a surfboard")["on"].startswith("what 'surfing' is done on")
    assert _missed(gen, "A boy riding on a skateboard")["on"].startswith("what 'riding' is done on")
    assert _missed(gen, "A man riding a horse on the beach")["on"].startswith("no false contrast")  # eighth round
    # people on a boat (a copula) rest on it: "beside", never "under"
    assert _replaced(gen, "People are on a boat", "on") == {"beside"}
    assert _replaced(gen, "A cake is on a plate", "on") <= {"under", "beside"}  # a thing may be under one
    # a body part near something: "a giraffe's head on a tree" is absurd
    assert _missed(gen, "A giraffe's head near a tree")["near"].startswith("body part")
    # "near" -> "under" of a thing was absurd ("a cow standing under a curb"): "on" only
    assert _replaced(gen, "A dog near a bench", "near") == {"on"}
    # a direction is no place ("pointing near the opposite direction"): WordNet files it as noun.location
    assert _missed(gen, "A dog running in the same direction")["in"].startswith("position object")


def test_fifth_round_no_size_swap_of_young_ones_and_no_sunrise(gen):
    assert not _replaced(gen, "A little girl holding a kite", "little")  # "a big girl" reads odd
    assert not _replaced(gen, "A small boy on a beach", "small")
    assert _replaced(gen, "A tall boy holding a kite", "tall") == {"short"}  # height is not age
    assert _replaced(gen, "A small dog on a bed", "small")  # not young: swapped as before
    assert not _replaced(gen, "A boat and a beautiful sunset", "sunset") & {"sunrise"}  # not told apart in a photo


def test_fifth_round_more_contrasts(gen):
    # a photo's bat is a baseball bat (WordNet's first is the animal, which only "watching" fitted)
    assert _replaced(gen, "A baseball player holding a bat", "holding") <= {"throwing", "dropping"}
    assert _replaced(gen, "A baseball player holding a bat", "holding")
    assert _replaced(gen, "A boat on calm water", "calm") == {"rough"}
    # a thing's or place's "has" -> "lacks" (as "with" -> "without"); never a person's, an animal's or its own part
    assert _replaced(gen, "This bathroom has a toilet", "has") == {"lacks"}
    assert _replaced(gen, "A bathroom that has a broken mirror", "has") == {"lacks"}  # the relative's noun
    assert not _replaced(gen, "A man has a beard", "has")
    assert not _replaced(gen, "A giraffe has its front legs spread", "has")
    assert not _replaced(gen, "A building has its lights on", "has")
    # a relative pronoun's verb is its noun's: "a man that is holding" a person's verb, a car's "sitting" none
    assert _replaced(gen, "A man that is holding a wine glass", "holding") == {"dropping"}
    assert _missed(gen, "A car that is sitting in the street.")["sitting"].startswith("posture verb")


def test_sixth_round_levels_are_fluent(gen):
    # after a verb, a preposition's object is no object of the prefix: the subject and it instead
    levels = [lv["positive"] for lv in gen.tree("People walk across the street at red traffic lights")]
    assert "People and red traffic lights" in levels
    assert "People walk across the street and red traffic lights" not in levels
    # a verb's direct object after the prefix still joins the prefix (the paper's "... and kites")
    assert "A man sitting on a bench and an umbrella" in [
        lv["positive"] for lv in gen.tree("A man sitting on a bench holding an umbrella")]
    # no level cut inside "X covered Y", "X mounted Y", "X of sleeping Y" or "the cats chin"
    levels = [lv["positive"] for lv in gen.tree("A meat covered sandwich on a plate")]
    assert levels[0] == "A meat covered sandwich" and "A meat" not in levels
    assert "a bathroom with a wall and white toilet" not in [
        lv["positive"] for lv in gen.tree("a bathroom with a wall mounted white toilet")]
    assert gen.tree("A flock of sleeping pink flamingos")[0]["positive"] == "A flock of sleeping pink flamingos"
    levels = [lv["positive"] for lv in gen.tree("a cat sleeping with a remote under the cats chin")]
    assert not any(lv.endswith("the cats") for lv in levels)
