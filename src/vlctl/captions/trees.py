"""3VL caption trees with one-word hard negatives (docs/methods.md §3.1).

Tree of a caption (Yellinek et al., "3VL", §III-A), coarse to fine:

    L1       the first noun phrase NP1                         "several people"
    then for each further noun phrase NP_k (k = 2, 3, ...):
             previous level + " and " + NP_k                   "several people and a green field"
             the caption from its start to the end of NP_k     "several people standing in a green field"
    last     the full caption, verbatim                        "several people standing ... flying kites"

Consecutive levels with the same words (identical, or differing only in punctuation and spaces,
as "a man on a bike" and the caption "a man on a bike.") are kept once, the later one. Noun phrases are spaCy noun chunks, less bare
pronouns ("it", "that"). A caption without noun phrase is a one-level tree (the caption); with
one it is [NP1, caption]. (The paper's worked example lists 4 levels for its caption and skips
"... and kites"; its general rule, which we follow, gives that 5th level.)

Negatives: at each level, one negative per NOUN / ADJ / ADP / VERB token of the level's
positive text that no earlier level contained (so what a coarse level taught flows down
unchanged); a token skipped for a reader's reason (`parse.SECOND_CANDIDATE`) is made up by another
word's candidate. A negative changes exactly one token and keeps every other character; it
never equals any positive of the tree. The replacement word comes from the stages of
`vlctl.captions.negatives` (curated table, WordNet antonyms and co-hyponyms, an optional masked
LM, the closed class); with a `vocabulary`, only words in it are used. Captions are checked
with `vlctl.captions.text.check_caption`.

What the parse says about each token (compounds, fixed phrases, why a token gets no negative) is
`vlctl.captions.parse`, with `prepositions` (their contrasts by object kind) and `subjects`
(animacy); the levels are `levels`, the curated word tables `tables`, word forms `inflection`, the
caption as text `text`; the tree cache is `cache.TreeCache`, 3VL's Anchor text `anchor`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from vlctl.captions import context, inflection, levels, parse, prepositions, subjects
from vlctl.captions import wordnet as wnmod
from vlctl.captions.cache import TreeCache
from vlctl.captions.inflection import _match_case, inflect_all, inflect_like, pluralize
from vlctl.captions.negatives import _ALNUM, _WORD, MIN_ZIPF, _hash_int, keep_candidates, zipf
from vlctl.captions.parse import _OVERRIDE_TAGS, _crude_base, _verb_lemma
from vlctl.captions.prepositions import ADP_CONTRASTS, RELATION_PHRASES
from vlctl.captions.tables import (
    ANIMATE_ADJ,
    ANIMATE_OBJECT_VERBS,
    CLOSED_CLASS,
    COLORS,
    INANIMATE_ADJ,
    NATURAL_COLORS,
    OPENING_ADJ,
    PETTABLE,
    PLURAL_SENSES,
    pos_table,
)
from vlctl.captions.text import MAX_WORDS, _nlp_id, check_caption, get_nlp, normalize_caption
from vlctl.config import opt, validate_config
from vlctl.fsops import VlctlError

# 3vl-trees-8 and -9: issue 21's seventh and eighth rounds (docs/findings.md, "Caption trees on real text"); a word
# skipped by their reading rules leaves its level another word's candidate.
GENERATOR_VERSION = "3vl-trees-9"
TREE_POS = ("NOUN", "ADJ", "ADP", "VERB")


# --- the generator -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TreeConfig:
    seed: int = opt(0, "seed of the choice among replacement candidates", ge=0, le=2**32 - 1)
    wordnet_dir: str | None = opt(None, "WordNet folder (default: $VLCTL_WORDNET_DIR, nltk_data, /usr/share/wordnet)")
    max_words: int = opt(MAX_WORDS, "refuse captions longer than this many words", ge=1, le=10_000)
    cache: str | None = opt(None, "JSONL file caching trees by caption hash and generator settings")

    def __post_init__(self) -> None:
        validate_config(self)  # every field in its declared range (the opt() above)


def sources_digest() -> str:
    """sha256 (16 hex) of every module of the caption language: each rule and table the trees are
    built by, so a change to any of them (a table added later included) makes new trees."""
    files = sorted(Path(__file__).parent.glob("*.py"))
    return hashlib.sha256(b"".join(f.name.encode() + f.read_bytes() for f in files)).hexdigest()[:16]


class TreeGenerator:
    """Builds 3VL caption trees (see the module docstring).

    seed         : picks among the candidates of a stage (with a hash of the caption)
    opposites    : domain table {word: [replacements]}; its entries come before the curated ones
                   and are taken as they are (no frequency or WordNet filter: the domain's words)
    vocabulary   : when given, every replacement word must be in it (a synthetic dataset's words)
    mlm          : optional masked-LM generator (caption tokens, token index) -> candidate words
    wordnet_dir  : WordNet folder; default $VLCTL_WORDNET_DIR, nltk_data, /usr/share/wordnet
    use_wordnet  : False skips WordNet (curated tables only)
    pos          : coarse spaCy POS tags that get negatives
    cache_path   : JSONL tree cache (TreeCache)
    max_words    : longer captions are refused
    pos_overrides: {word: coarse POS} forced over spaCy's tag ("striped": "ADJ" where spaCy reads
                   a verb); the parse's noun chunks then follow the forced tags
    min_zipf     : replacements rarer than this wordfreq Zipf frequency are never used
    co_hyponyms  : True adds WordNet co-hyponyms for nouns the tables lack (3VL's second source;
                   off by default: 1 of 11 judged acceptable on COCO, "room" -> "auditorium")

    `tree(caption)` -> [{"positive": str, "negatives": [str], "negative_pos": [str]}, ...];
    with details=True each level also has "replaced" [[word, replacement, pos, stage]],
    "missed" [[word, pos]] (every tree-POS word of the level left without a negative) and
    "missed_reason" [str] (why, aligned with "missed"). When the input was normalised (HTML,
    whitespace, all-caps words, ...), the last level also has "normalized": {"from": the input,
    "steps": [...]} (public format too) and its positive is the normalised caption.
    """

    def __init__(self, seed: int = 0, opposites: Mapping[str, Sequence[str]] | None = None,
                 vocabulary: Iterable[str] | None = None, mlm: Callable[[list[str], int], list[str]] | None = None,
                 wordnet_dir: str | os.PathLike | None = None, use_wordnet: bool = True,
                 pos: Sequence[str] = TREE_POS, cache_path: str | os.PathLike | None = None,
                 max_words: int = MAX_WORDS, pos_overrides: Mapping[str, str] | None = None,
                 min_zipf: float = MIN_ZIPF, co_hyponyms: bool = False):
        self.seed = seed
        self.opposites = opposites
        self.vocabulary = vocabulary
        self.mlm = mlm
        self.wordnet_dir = wordnet_dir
        self.use_wordnet = use_wordnet
        self.pos = pos
        self.cache_path = cache_path
        self.max_words = max_words
        self.pos_overrides = pos_overrides
        self.min_zipf = min_zipf
        self.co_hyponyms = co_hyponyms
        self._ready = False

    # state derived from the hyperparameters on first use
    def _prepare(self) -> None:
        if self._ready:
            return
        self.domain_ = {}
        for word, repl in (self.opposites or {}).items():
            if not isinstance(word, str) or isinstance(repl, str) or not all(isinstance(r, str) for r in repl):
                raise VlctlError(f"opposites: entry {word!r}: {repl!r} must map a word to a list of words")
            bad = [r for r in [word, *repl] if not _WORD.match(r.lower())]
            if bad:
                raise VlctlError(f"opposites: entry {word!r} has non-word(s) {bad}; a negative replaces one word "
                                 "by one word (lowercase letters only)")
            self.domain_[word.lower()] = tuple(dict.fromkeys([r.lower() for r in repl]))
        overrides = {}
        for word, tag in (self.pos_overrides or {}).items():
            if not isinstance(word, str) or not _WORD.match(word.lower()) or tag not in _OVERRIDE_TAGS:
                raise VlctlError(f"pos_overrides: entry {word!r}: {tag!r} must map a word to one of "
                                 f"{sorted(_OVERRIDE_TAGS)}")
            overrides[word.lower()] = tag
        self.overrides_ = overrides
        self.vocab_ = None if self.vocabulary is None else frozenset(w.lower() for w in self.vocabulary)
        self.wn_ = wnmod.load_wordnet(self.wordnet_dir) if self.use_wordnet else None
        self.pos_ = tuple(self.pos)
        self.nlp_ = get_nlp()
        fp = {
            "opposites": sorted((k, list(v)) for k, v in (self.opposites or {}).items()),
            "vocabulary": None if self.vocab_ is None else sorted(self.vocab_),
            "mlm": None if self.mlm is None else getattr(self.mlm, "__qualname__", type(self.mlm).__name__),
            "wordnet": None if self.wn_ is None else self.wn_.get_version(),
            "pos": list(self.pos_),
            "pos_overrides": sorted(overrides.items()),
            "min_zipf": self.min_zipf,
            "co_hyponyms": self.co_hyponyms,
            "spacy": _nlp_id(),
            # every rule and table of the generator (a table added later is covered without a new entry here)
            "sources": sources_digest(),
        }
        self.fingerprint_ = hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]
        self.cache_ = TreeCache(self.cache_path) if self.cache_path is not None else None
        self._stage_cache: dict[tuple, tuple] = {}
        self._ready = True

    def cache_key(self, caption: str, seed: int | None = None) -> str:
        self._prepare()
        s = self.seed if seed is None else seed
        return hashlib.sha256(f"{GENERATOR_VERSION}\x1f{s}\x1f{self.fingerprint_}\x1f{caption}".encode()).hexdigest()

    # -- candidates --

    def _candidates(self, lower: str, base: str, tag: str, pos: str, transitive: bool, kind: str,
                    adjectival: bool, animate: bool = True, person: bool = True) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Context-free candidate lists per stage for one word (cached): [(stage, words)], each
        word already in the original's form, filtered (frequency, same lemma, synonyms,
        hypernyms, hyponyms)."""
        key = (lower, base, tag, pos, transitive, kind, adjectival, animate, person)
        hit = self._stage_cache.get(key)
        if hit is not None:
            return hit
        wn = self.wn_

        form = functools.partial(inflect_all, tag=tag, pos=pos)  # form(words, domain=False)
        keep = functools.partial(keep_candidates, wn, lower=lower, base=base, pos=pos, min_zipf=self.min_zipf)
        out: list[tuple[str, tuple[str, ...]]] = []
        if lower in self.domain_:
            out.append(("table", keep(self.domain_[lower], domain=True)))
        elif base in self.domain_:
            out.append(("table", keep(form(self.domain_[base], domain=True), domain=True)))
        if pos == "ADP":
            words = ADP_CONTRASTS.get((lower, kind)) or ADP_CONTRASTS.get((lower, "*"), ())
            if self.vocab_ is not None:
                # a closed domain (scenes): every contrast of the preposition, the kind's first
                words = tuple(dict.fromkeys([*words, *(w for (q, _), ws in ADP_CONTRASTS.items() if q == lower
                                                       for w in ws)]))
            out.append(("table", keep(words)))
        elif adjectival:
            # a participle used as an adjective ("the opened fridge", "a lit sign"): the
            # adjective's contrast, uninflected ("closed", "dark")
            out.append(("table", keep(pos_table("ADJ").get(base, ()) or pos_table("ADJ").get(lower, ()))))
        else:
            table = pos_table(pos, transitive, animate, person)
            if lower in table and pos != "VERB" and not (tag == "NNS" and lower == base):
                out.append(("table", keep(table[lower])))
            elif lower in table and pos == "NOUN":  # a plural that is its own lemma: "sheep", "broccoli"
                out.append(("table", keep(form(table[lower]))))
            elif base in table and lower not in PLURAL_SENSES:  # ("glasses" are not glass cups)
                out.append(("table", keep(form(table[base]))))
        if wn is not None and pos in ("NOUN", "ADJ", "VERB") and (pos != "VERB" or animate and tag != "VBN"):
            # (a thing's verb antonym is absurd, "a tree gathering its pollen"; a participle's too, "snow emptied")
            # seventh round: visual contrasts only ("a tasty looking cake" -> "a tasteless looking cake" is not);
            # the others are never used, they only tell _replace that the word owes its level a negative
            ants = [w for w in wnmod.mfs_antonyms(wn, base, pos) if not wnmod.morphological_antonym(base, w)]
            visual = wnmod.visual_antonyms(wn, base, pos)
            out.append(("antonym", keep(form(w for w in ants if w in visual))))
            out.append(("not_visual", keep(form(w for w in ants if w not in visual))))
            if pos == "NOUN" and self.co_hyponyms:
                sisters = keep(form(n.replace("_", " ") for n in wnmod.mfs_co_hyponyms(wn, base, pos)))
                # WordNet sisters are the noisiest source: only everyday words (Zipf >= 3.5)
                out.append(("co_hyponym", tuple(w for w in sisters if zipf(w) >= self.min_zipf + 0.5)))
        out.append(("mlm", ()))  # context-dependent: filled per token
        if wn is None and pos in CLOSED_CLASS:
            out.append(("closed_class", keep(CLOSED_CLASS[pos])))
        res = tuple(out)
        self._stage_cache[key] = res
        return res

    def _replace(self, doc, i: int, caption: str, seed: int, render: Callable[[str], str],
                 positives: set[str], span: tuple[int, int]) -> tuple[str, str, str] | str:
        """(negative text, replacement word, stage) for token i (or its unit), or the reason
        why none was found."""
        tok = doc[i]
        a, b = span
        lower = doc[a:b].text.lower() if b - a > 1 else tok.lower_
        if lower in RELATION_PHRASES:  # "in front of" -> "behind" (parse.relation_phrase found it)
            kind = doc.user_data.get("vlctl_relation", (0, 0, "*"))[2]
            words = [w for w in RELATION_PHRASES[lower].get(kind, RELATION_PHRASES[lower].get("*", ()))
                     if self.vocab_ is None or w in self.vocab_]
            texts = [render(_match_case(w, doc[a].text)) for w in words]
            return next(((t, w, "table") for t, w in zip(texts, words) if t not in positives), "no candidate")
        pos, tag = tok.pos_, tok.tag_
        wn = self.wn_
        if b - a > 1:  # a compound: its WordNet lemma
            base = " ".join([t.lower_ for t in doc[a:b - 1]] + [wnmod.base_form(wn, doc[b - 1].lower_, "NOUN")])
            pos = "NOUN"
        elif pos == "VERB" and tag in ("VBN", "VBD") and tok.dep_ == "amod":
            base = _verb_lemma(lower)
        else:
            base = wnmod.base_form(wn, lower, pos) if wn is not None else _crude_base(lower, tag)
            if pos == "VERB":
                base = _verb_lemma(lower) if wn is None else base
        transitive = pos == "VERB" and any(c.dep_ in ("dobj", "obj") for c in tok.children)
        kind = parse.adp_kind(wn, tok) if pos == "ADP" else "*"  # the object's kind: "thing", "place", ...
        adjectival = pos == "VERB" and tag in ("VBN", "VBD") and tok.dep_ == "amod"
        animate = subjects.animate_subject(self.wn_, tok) if pos == "VERB" else True
        person = pos != "VERB" or subjects.animate_subject(self.wn_, tok, people_only=True)
        colors_ok, opening = None, True  # the colours a replacement may be (None: any); open/closed fits
        if pos == "ADJ":
            animate = subjects.animate_noun(self.wn_, tok.head) if tok.head is not tok else True
            # a natural thing's colour is not free: "a green horse", "a lush white field", "a
            # purple banana" are absurd; an animal's coat keeps to coat colours
            lex = wnmod.noun_lexname(wn, wnmod.described_noun(tok))
            colors_ok = None if NATURAL_COLORS.get(lex) is None else frozenset(NATURAL_COLORS[lex])
            opening = wn is None or lex == "noun.artifact"  # "an open door", never "a closed field"
        h = _hash_int(seed, caption, i)
        n_seen = 0
        # a word the level has makes a muddled negative ("a stove and stove"; a domain table's words are the
        # domain's), a noun of the caption one that stays true ("a sign" -> "a clock" of "... a wall clock"), in any
        # inflection, and in open captions (`cw`, seventh round) any word but a preposition ("One black cow and two
        # brown cows" -> "One brown cow"; a closed domain's "a small red cube" of "... a small blue cube" binds)
        seen = set(_ALNUM.findall(render(doc[a:b].text).lower())) | (parse.caption_words(doc, wn) if pos == "NOUN" else set())
        cw = parse.caption_words(doc, wn) if pos not in ("NOUN", "ADP") and self.vocab_ is None else frozenset()
        owes = False  # a word left with no candidate by the seventh round's reading rules owes its level another's
        domain = lower in self.domain_ or base in self.domain_
        fit = None  # the noun's modifiers must still fit the new noun ("the blue bird" -> "the blue elephant")
        if pos == "NOUN" and wn is not None:
            fit = functools.partial(parse.modifiers_fit, wn, doc[b - 1], colors=NATURAL_COLORS, start=a)
        young = pos == "ADJ" and wn is not None and wnmod.young_phrase(wn, wnmod.described_noun(tok))
        mass = parse.after_quantity(tok) if pos == "NOUN" and (tag == "NN" or lower == base) else None
        animate_obj = transitive and any(c.dep_ == "dobj" and subjects.is_animate_kind(wn, c) for c in tok.children)
        # "feeding a horse", never "feeding a bat" or "petting a teddy bear" (a curated animal, whole)
        pettable = transitive and wn is not None and any(c.dep_ == "dobj" and (o := wnmod.base_form(
            wn, c.lower_, "NOUN")) in PETTABLE and not wnmod.is_compound(wn, (doc[c.i - 1].lower_, o)) for c in tok.children)
        # a resting verb takes only a place: "eating from a tree" -> "sleeping from a tree" is not English
        resting_ok = pos != "VERB" or all(c.lower_ in prepositions.LOCATIVE_ADP for c in tok.children if c.dep_ == "prep")
        # "seven giraffe" (a plural the caption misspelt) -> "seven birds", not "seven bird"
        counted = pos == "NOUN" and tag == "NN" and any(c.dep_ == "nummod" and c.lower_ != "one" for c in tok.children)
        absurd = (context.context_excluded(wn, doc, tok, base, parse.caption_words(doc, wn))
                  if wn is not None and self.vocab_ is None and pos in ("NOUN", "VERB") and b - a == 1 else None)
        for k_stage, (stage, words) in enumerate(self._candidates(lower, base.replace("_", " "), tag, pos,
                                                                  transitive and animate, kind, adjectival, animate,
                                                                  person)):
            if stage == "antonym" and pos == "VERB" and subjects.group_subject(wn, tok):
                continue  # "people gather" -> "people spread", "a crowd attending" -> "missing"
            if not (domain and k_stage == 0):
                bases = {w: wnmod.base_form(wn, w, pos) for w in words}  # once per candidate: morphy is not cheap
                words = tuple(w for w in words if w not in seen and not (
                    pos == "ADJ" and (w in ANIMATE_ADJ if not animate
                                      else w in INANIMATE_ADJ and subjects.head_is_animate(self.wn_, tok)))
                    and not (colors_ok is not None and (w in COLORS or lower in COLORS) and w not in colors_ok)
                    and bases[w] not in seen
                    and not (fit is not None and not fit(bases[w]))  # fit is set for nouns only: pos == "NOUN"
                    and not (young and (w in ("old", "young", "new") or lower in parse.CHILD_SIZES and subjects.
                                        is_animate_kind(wn, wnmod.described_noun(tok))))  # "a big girl"
                    and not (pos == "ADJ" and not opening and (w in OPENING_ADJ or lower in OPENING_ADJ))
                    and (pettable or _verb_lemma(w) not in ANIMATE_OBJECT_VERBS)  # "feeding a bike"
                    and (resting_ok or _verb_lemma(w) not in parse.RESTING_VERBS)
                    # heavy animals do not jump; a verb with an object keeps a transitive verb
                    # ("three cows are eating food" -> "sleeping food")
                    and (pos != "VERB" or parse.lack_fits(wn, tok, w) or _verb_lemma(w) != "lack" and not (not person and (
                        _verb_lemma(w) in ("jump", "point") or transitive and (stage != "table" or not animate))))
                    and not (animate_obj and _verb_lemma(w) not in ("watch", "feed", "pet")))  # "dropping young girls"
                kept = tuple(w for w in words if w not in cw and bases[w] not in cw and not (absurd and absurd(w)))
                owes, words = owes or len(kept) < len(words) or stage == "not_visual" and bool(kept), kept
                if counted:
                    words = tuple(inflect_like(w, "NNS", "NOUN") or pluralize(w) for w in words)
                if mass:  # "a pile of carrots", not "a pile of carrot"; "a piece of fruit" -> "of cheese"
                    words = tuple(inflection.mass_or_plural(wn, w, mass) for w in words)
            if stage == "not_visual":
                continue  # (only for `owes`)
            if stage == "mlm":
                if self.mlm is None:
                    continue
                words = tuple(w.strip().lower() for w in self.mlm([t.text for t in doc], i))
                words = tuple(w for w in dict.fromkeys(words) if w != lower and _WORD.match(w))
            if self.vocab_ is not None:
                words = tuple(w for w in words if all(p in self.vocab_ for p in w.split(" ")))
            n = len(words)
            n_seen += n
            for k in range(n):
                word = words[(h + k) % n]
                text = render(_match_case(word, doc[a].text))
                if text not in positives:
                    return text, word, stage
        if n_seen:
            return "every candidate is a positive"
        if owes:
            return "no candidate (a word of the caption or a non-visual antonym)" + parse.SECOND_CANDIDATE
        return "no candidate (after the frequency and WordNet filters)"

    # -- trees --

    def _build(self, doc, caption: str, seed: int) -> list[dict]:
        parse.retag(doc, self.overrides_, self.wn_)
        units = parse.word_units(doc, self.wn_)
        fixed = parse.fixed_phrases(doc)
        lead = len(caption) - len(caption.lstrip())
        pieces_per_level = levels.level_pieces(doc, caption, lead, units, self.wn_ if self.vocab_ is None else None)
        texts = [" and ".join(caption[a:b] for a, b in pieces) for pieces in pieces_per_level]
        # Consecutive levels with the same words ("a cat on a mat" then "a cat on a mat.") are one
        # level; the later one is kept, so the last level is always the caption itself.
        words = [_ALNUM.findall(t) for t in texts]
        keep = [k for k in range(len(texts)) if k == len(texts) - 1 or words[k] != words[k + 1]]
        pieces_per_level = [pieces_per_level[k] for k in keep]
        texts = [texts[k] for k in keep]
        positives = set(texts)
        done: set[int] = set()
        used: dict[int, tuple] = {}  # every replaced word: (span, relation, name, POS, level)
        tree = []
        wanted = set(self.pos_) | {"PROPN"}
        for pieces, text in zip(pieces_per_level, texts):
            level = {"positive": text, "negatives": [], "negative_pos": [], "replaced": [], "missed": [],
                     "missed_reason": []}
            owed = []  # the level's words skipped for another word's candidate
            for p, (a, b) in enumerate(pieces):
                for tok in doc:
                    s = lead + tok.idx
                    if not (a <= s and s + len(tok.text) <= b) or tok.i in done:
                        continue
                    done.add(tok.i)
                    if tok.pos_ not in wanted or not tok.is_alpha:
                        continue
                    if tok.pos_ == "PROPN" and "NOUN" not in self.pos_:
                        continue
                    why = parse.skip_reason(doc, tok, fixed, units, self.wn_, self.vocab_ is None)
                    rel = parse.relation_phrase(doc, tok, fixed, units, self.wn_) if why else None
                    if rel and lead + doc[rel[0]].idx < a:  # "X and the middle of a field": at a later level
                        done.discard(tok.i)
                        continue
                    if why is not None and rel is None:
                        level["missed"].append([tok.text, tok.pos_])
                        level["missed_reason"].append(why)
                        owed += [tok.i] if why.endswith(parse.SECOND_CANDIDATE) else []
                        continue
                    u0, u1 = rel[:2] if rel else units.get(tok.i, (tok.i, tok.i + 1))
                    upos = "ADP" if rel else "NOUN" if u1 - u0 > 1 else tok.pos_
                    doc.user_data["vlctl_relation"] = rel  # (its kind, for _replace)
                    render = parse.renderer(doc, caption, lead, pieces, p, (u0, u1))
                    got = self._replace(doc, tok.i, caption, seed, render, positives, (u0, u1))
                    if isinstance(got, str):
                        level["missed"].append([doc[u0:u1].text if u1 - u0 > 1 else tok.text, tok.pos_])
                        level["missed_reason"].append(got)
                        owed += [tok.i] if got.endswith(parse.SECOND_CANDIDATE) else []
                        continue
                    neg, word, stage = got
                    if neg in level["negatives"]:
                        continue
                    level["negatives"].append(neg)
                    level["negative_pos"].append(upos)
                    level["replaced"].append([doc[u0:u1].text if u1 - u0 > 1 else tok.text, word, upos, stage])
                    used[tok.i] = ((u0, u1), rel, level["replaced"][-1][0], upos, len(tree))
            if owed:
                self._second_candidates(doc, caption, seed, lead, pieces, level, positives, used, owed, len(tree))
            tree.append(level)
        return tree

    def _second_candidates(self, doc, caption, seed, lead, pieces, level, positives, used, owed, k) -> None:
        """Each word of level k skipped for a reader's reason (parse.SECOND_CANDIDATE; indices `owed`) is made up by
        one negative of another replaced word of the level, its first candidate not yet a negative of the level: a
        word of the skipped one's phrase first ("in a field": field), then the level's own, then the nearest."""
        taken: set[int] = set()
        for j in owed:
            near = {t.i for t in doc[j].subtree}
            for i in sorted(set(used) - taken, key=lambda i: (i not in near, used[i][4] != k, abs(i - j), i)):
                (u0, u1), rel, name, upos, _ = used[i]
                s, e = lead + doc[u0].idx, lead + doc[u1 - 1].idx + len(doc[u1 - 1].text)
                p = next((q for q, (x, y) in enumerate(pieces) if x <= s and e <= y), None)
                if p is None:
                    continue
                doc.user_data["vlctl_relation"] = rel
                got = self._replace(doc, i, caption, seed, parse.renderer(doc, caption, lead, pieces, p, (u0, u1)),
                                    positives | set(level["negatives"]), (u0, u1))
                if not isinstance(got, str):
                    taken.add(i)
                    level["negatives"].append(got[0])
                    level["negative_pos"].append(upos)
                    level["replaced"].append([name, got[1], upos, got[2]])
                    break

    @staticmethod
    def _public(tree: list[dict], details: bool) -> list[dict]:
        if details:
            return tree
        out = []
        for lv in tree:
            row = {"positive": lv["positive"], "negatives": list(lv["negatives"]),
                   "negative_pos": list(lv["negative_pos"])}
            if "normalized" in lv:
                row["normalized"] = lv["normalized"]
            out.append(row)
        return out

    def normalize(self, caption: str) -> tuple[str, list[str]]:
        """(the text the tree is built from, the normalisation steps applied); see
        `vlctl.captions.text.normalize_caption`."""
        return normalize_caption(caption)

    def check(self, caption: Any, what: str = "caption") -> str:
        self._prepare()
        return check_caption(caption, what, self.max_words, self.wn_)

    def tree(self, caption: str, seed: int | None = None, details: bool = False) -> list[dict]:
        """The caption tree of one caption (see the class docstring for the level format)."""
        return self.trees([caption], seed=seed, details=details)[0]

    def trees(self, captions: Sequence[str], seed: int | None = None, details: bool = False,
              errors: str = "raise", batch_size: int = 256) -> list[list[dict] | None]:
        """Trees of many captions, parsed in batches with nlp.pipe (much faster than one by one).

        errors="raise" stops at the first bad caption (VlctlError); "skip" gives None for it.
        """
        s = self.seed if seed is None else seed
        out: list[list[dict] | None] = [None] * len(captions)
        todo: list[int] = []
        clean: dict[int, tuple[str, list[str]]] = {}
        for k, cap in self._accepted(captions, errors):
            hit = self.cache_.get(self.cache_key(cap, s), cap) if self.cache_ is not None else None
            if hit is not None:
                out[k] = self._public(hit, details)
            else:
                todo.append(k)
                clean[k] = normalize_caption(cap)
        docs = self.nlp_.pipe((clean[k][0].strip() for k in todo), batch_size=batch_size)
        for k, doc in zip(todo, docs):
            text, steps = clean[k]
            tree = self._build(doc, text, s)
            if steps:
                tree[-1]["normalized"] = {"from": captions[k], "steps": steps}
            if self.cache_ is not None:
                self.cache_.put(self.cache_key(captions[k], s), captions[k], tree)
            out[k] = self._public(tree, details)
        return out

    def _accepted(self, captions: Sequence[str], errors: str) -> list[tuple[int, str]]:
        """(index, caption) of the captions `check` accepts; a refused one raises (errors="raise") or is
        left out (errors="skip")."""
        if errors not in ("raise", "skip"):
            raise VlctlError(f"errors must be 'raise' or 'skip', got {errors!r}")
        self._prepare()
        ok = []
        for k, cap in enumerate(captions):
            try:
                self.check(cap, f"caption {k}" if len(captions) > 1 else "caption")
            except VlctlError:
                if errors == "raise":
                    raise
                continue
            ok.append((k, cap))
        return ok

    def random_negative(self, caption: str, seed: int | None = None) -> tuple[str, str] | None:
        """One rule-based one-word negative of the whole caption: the NegCLIP-style baseline.

        The tokens of the tree POS classes are tried in a seeded random order; the first one with
        a replacement gives (negative caption, its POS). None when no token has one. The
        caption is normalised first (as for trees), so the negative is of the normalised text.
        """
        self._prepare()
        self.check(caption)
        text, _ = normalize_caption(caption)
        return self._negative(self.nlp_(text.strip()), caption, text, self.seed if seed is None else seed)

    def random_negatives(self, captions: Sequence[str], seed: int | None = None, errors: str = "raise",
                         batch_size: int = 256) -> list[tuple[str, str] | None]:
        """`random_negative` of many captions, parsed in batches with nlp.pipe as `trees` does (about 3x
        faster per caption than one parse each). errors="skip" gives None for a caption `check` refuses."""
        s = self.seed if seed is None else seed
        out: list[tuple[str, str] | None] = [None] * len(captions)
        texts = {k: normalize_caption(cap)[0] for k, cap in self._accepted(captions, errors)}
        docs = self.nlp_.pipe((t.strip() for t in texts.values()), batch_size=batch_size)
        for (k, text), doc in zip(texts.items(), docs):
            out[k] = self._negative(doc, captions[k], text, s)
        return out

    def _negative(self, doc, caption: str, text: str, s: int) -> tuple[str, str] | None:
        """The random negative of `caption` from the parse `doc` of its normalised `text`."""
        lead = len(text) - len(text.lstrip())
        parse.retag(doc, self.overrides_, self.wn_)
        units, fixed = parse.word_units(doc, self.wn_), parse.fixed_phrases(doc)
        cands = [t for t in doc if t.pos_ in self.pos_ and t.is_alpha and parse.skip_reason(doc, t, fixed, units, self.wn_, self.vocab_ is None) is None]
        cands.sort(key=lambda t: _hash_int("random_negative", s, caption, t.i))
        for tok in cands:
            u0, u1 = units.get(tok.i, (tok.i, tok.i + 1))
            start = lead + doc[u0].idx
            n = lead + doc[u1 - 1].idx + len(doc[u1 - 1].text) - start

            def render(word: str, start=start, n=n) -> str:
                return text[:start] + word + text[start + n:]

            got = self._replace(doc, tok.i, text, s, render, {text}, (u0, u1))
            if not isinstance(got, str):
                return got[0], tok.pos_
        return None




# --- module-level API --------------------------------------------------------------------------

_DEFAULT: TreeGenerator | None = None


def default_generator() -> TreeGenerator:
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = TreeGenerator()
    return _DEFAULT


def caption_tree(caption: str, seed: int = 0) -> list[dict]:
    """3VL caption tree: [{"positive": str, "negatives": [str], "negative_pos": [str]}, ...],
    coarse to fine, the last positive being the caption itself (default generator settings)."""
    return default_generator().tree(caption, seed=seed)


def random_negative(caption: str, seed: int = 0) -> tuple[str, str] | None:
    """(negative caption, POS of the replaced word) with one random word replaced, or None."""
    return default_generator().random_negative(caption, seed=seed)
