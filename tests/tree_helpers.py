"""Shared by the tests of the caption-tree rounds (issue 21): the WordNet skip mark, a generator fixture
and the lookups of what a tree replaced and missed."""

from __future__ import annotations

import pytest

from vlctl.captions.trees import TreeGenerator

needs_wordnet = pytest.mark.needs_wordnet  # tests/conftest.py skips it where WordNet is missing


def prepared_generator() -> TreeGenerator:
    """A default generator with spaCy, WordNet and the tables loaded (a module-scoped fixture's value)."""
    g = TreeGenerator()
    g._prepare()
    return g


def negs(gen, caption):
    """(level, negative, [word, replacement, POS, stage]) of every negative of the caption's tree."""
    return [(lv["positive"], neg, r) for lv in gen.tree(caption, details=True)
            for neg, r in zip(lv["negatives"], lv["replaced"])]


def replaced(gen, caption, word):
    """The replacements of `word` anywhere in the caption's tree."""
    return {r[1] for _, _, r in negs(gen, caption) if r[0] == word}


def missed(gen, caption):
    """{word: why it got no negative} over the caption's tree."""
    return {m[0]: why for lv in gen.tree(caption, details=True) for m, why in zip(lv["missed"], lv["missed_reason"])}
