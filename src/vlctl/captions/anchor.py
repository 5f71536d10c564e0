"""3VL's Anchor text (docs/methods.md §3.3, §IV-B of the paper).

For a positive P and a negative N that differ in a few words, DP / DN are the words of P / N
outside the longest common word alignment (difflib), AP / AN the smallest span of P / N covering
the noun chunk or verb/adposition phrase of every word of DP / DN, and the anchor text is
"AP or AN" ("people playing with airborne frisbee" / "... with sitting frisbee" ->
"airborne frisbee or sitting frisbee"). Both texts must pass the English check trees use
(`check_caption` with WordNet, so "bare hand" / "stained hand" is English). Texts that share
no word are refused unless each has at most two words besides articles ("a person" / "an
animal", a tree's first level): there the anchor is the two texts.

Swapped pairs ("A pizza sitting on top of a pizza box" / "A pizza box sitting on top of a
pizza") have the same words on both sides; there AP and AN grow to cover every changed place
(and the word before an insertion), which gives the two orderings. A side never ends in a
dangling function word (a preposition or article takes its noun chunk).
"""

from __future__ import annotations

import difflib
import warnings

from vlctl.captions import wordnet as wnmod
from vlctl.captions.text import MAX_WORDS, check_caption, get_nlp
from vlctl.fsops import VlctlError

_ARTICLES = ("a", "an", "the")
_OBJECT_DEPS = ("dobj", "attr", "oprd", "dative", "pobj", "pcomp", "obj")


def _chunk_index(doc) -> dict[int, tuple[int, int]]:
    where = {}
    for c in doc.noun_chunks:
        for i in range(c.start, c.end):
            where[i] = (c.start, c.end)
    return where


def _phrase(tok, chunks: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """Token span [start, end) of the minimal noun or verb/adposition phrase holding `tok`."""
    def chunk_of(t):
        return chunks.get(t.i, (t.i, t.i + 1))

    def join(*spans):
        return min(s for s, _ in spans), max(e for _, e in spans)

    me = (tok.i, tok.i + 1)
    if tok.i in chunks:
        return chunks[tok.i]
    if tok.pos_ == "ADP":
        objs = [c for c in tok.children if c.dep_ in ("pobj", "pcomp")]
        return join(me, *[chunk_of(o) for o in objs]) if objs else join(me, chunk_of(tok.head))
    if tok.pos_ in ("VERB", "AUX"):
        objs = [c for c in tok.children if c.dep_ in _OBJECT_DEPS]
        if objs:
            return join(me, *[chunk_of(o) for o in objs])
        preps = [c for c in tok.children if c.dep_ == "prep"]
        for p in preps:
            pobj = [c for c in p.children if c.dep_ == "pobj"]
            if pobj:
                return join(me, chunk_of(pobj[0]))
        if tok.head is not tok and tok.head.i in chunks:  # "a dog running", "sitting frisbee"
            return join(me, chunks[tok.head.i])
        subj = [c for c in tok.children if c.dep_ in ("nsubj", "nsubjpass")]
        return join(me, chunk_of(subj[0])) if subj else me
    if tok.head is not tok and tok.head.i in chunks:  # amod outside a chunk, a number, ...
        return join(me, chunks[tok.head.i])
    if tok.dep_ == "acomp":  # "the dog is white" -> "the dog is white"
        subj = [c for c in tok.head.children if c.dep_ in ("nsubj", "nsubjpass")]
        if subj:
            return join(me, chunk_of(subj[0]))
    return me


def _words(doc) -> list:
    return [t for t in doc if not (t.is_punct or t.is_space)]


def anchor_diff(positive: str, negative: str) -> tuple[list[str], list[str]]:
    """(DP, DN): the words of P and of N outside their longest common word alignment."""
    dp, dn, *_ = _anchor_parts(positive, negative)
    return [t.text for t in dp], [t.text for t in dn]


def _wordnet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no WordNet: the trees warned already; the check is weaker
        return wnmod.load_wordnet()


def _anchor_parts(positive: str, negative: str):
    wn = _wordnet()
    check_caption(positive, "positive", MAX_WORDS, wn)
    check_caption(negative, "negative", MAX_WORDS, wn)
    nlp = get_nlp()
    p_doc, n_doc = nlp(positive.strip()), nlp(negative.strip())
    pw, nw = _words(p_doc), _words(n_doc)
    sm = difflib.SequenceMatcher(None, [t.lower_ for t in pw], [t.lower_ for t in nw], autojunk=False)
    dp, dn, shared = [], [], 0
    p_at, n_at = [], []  # insertion points: where the other side's words would go
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            shared += i2 - i1
            continue
        dp += pw[i1:i2]
        dn += nw[j1:j2]
        if i1 == i2:
            p_at += [pw[k] for k in (i1 - 1, i1) if 0 <= k < len(pw)]
        if j1 == j2:
            n_at += [nw[k] for k in (j1 - 1, j1) if 0 <= k < len(nw)]
    if not dp and not dn:
        raise VlctlError(f"positive and negative differ in no word ({positive!r}); Anchor needs a difference")
    content = [t for t in pw if t.lower_ not in _ARTICLES], [t for t in nw if t.lower_ not in _ARTICLES]
    if shared == 0 and max(len(content[0]), len(content[1])) > 2:
        raise VlctlError(f"positive {positive!r} and negative {negative!r} differ in every word; Anchor needs "
                         "texts that differ in a few words")
    return dp, dn, p_doc, n_doc, p_at, n_at


def anchor_text(positive: str, negative: str) -> str:
    """3VL's Anchor text "AP or AN" for a positive and a negative differing in a few words.

    AP (AN) is the smallest span of P (N) covering the noun chunk, or the verb/adposition phrase
    (the verb or adposition with its attached noun chunk), of every word of DP (DN). When one
    side only inserts words, the other side's phrase is the one at the insertion point.
    """
    dp, dn, p_doc, n_doc, p_at, n_at = _anchor_parts(positive, negative)
    ap, an = _span(p_doc, dp or p_at[-1:]), _span(n_doc, dn or n_at[-1:])
    if _same(ap, an):
        # a swap: the same words on both sides; cover every changed place of each side
        ap, an = _span(p_doc, dp + p_at), _span(n_doc, dn + n_at)
    if _same(ap, an):
        ap, an = p_doc.text, n_doc.text
    return f"{ap} or {an}"


def _same(a: str, b: str) -> bool:
    return [w.lower() for w in a.split()] == [w.lower() for w in b.split()] or \
        "".join(c for c in a.lower() if c.isalnum()) == "".join(c for c in b.lower() if c.isalnum())


_FUNCTION_POS = ("ADP", "DET", "CCONJ", "SCONJ", "PART", "AUX")


def _span(doc, toks) -> str:
    chunks = _chunk_index(doc)
    spans = [_phrase(t, chunks) for t in toks]
    s, e = min(s for s, _ in spans), max(e for _, e in spans)
    # never a dangling function word at the end: "on top of" takes "a pizza"
    while e < len(doc) and doc[e - 1].pos_ in _FUNCTION_POS:
        e = chunks.get(e, (e, e + 1))[1]
    # whole written words: "theres" is parsed "there" + "s", "There's" "There" + "'s"
    while s > 0 and not doc[s - 1].whitespace_ and not doc[s - 1].is_punct:
        s -= 1
    while e < len(doc) and not doc[e - 1].whitespace_ and not doc[e].is_punct:
        e += 1
    return doc[s:e].text
