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
unchanged). A negative changes exactly that one token and keeps every other character; it
never equals any positive of the tree. The replacement word comes from the stages of
`vlctl.methods.negatives` (curated table, WordNet antonyms and co-hyponyms, an optional masked
LM, the closed class); with a `vocabulary`, only words in it are used. Captions are checked
with `vlctl.methods.negatives.check_caption`.

3VL's Anchor text is `vlctl.methods.anchor` (`anchor_text`, `anchor_diff`, importable from here
too).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from vlctl.config import opt, validate_config
from vlctl.io import VlctlError
from vlctl.methods import wordnet as wnmod
from vlctl.methods.anchor import anchor_diff, anchor_text  # noqa: F401 (their old home)
from vlctl.methods.negatives import (  # noqa: F401 (CLOSED_CLASS ... caption_hash: their old home)
    _ALNUM,
    _COPULA,
    _WORD,
    CLOSED_CLASS,
    MAX_CHARS,
    MAX_WORDS,
    OPPOSITES,
    STAGES,
    _hash_int,
    _match_case,
    _nlp_id,
    caption_hash,
    check_caption,
    get_nlp,
    inflect_verb,
    pluralize,
)

GENERATOR_VERSION = "3vl-trees-1"
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


class TreeCache:
    """Trees on disk as JSON lines {"key", "caption", "tree"}, one per caption and settings.

    The key hashes the generator version, seed, settings fingerprint and caption, so a line
    written under other settings is never returned. Appends write one whole line with O_APPEND
    (several processes may share the file); a truncated or corrupt line (a crash mid-write) is
    skipped with a warning.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._entries: dict[str, tuple[str, list]] = {}
        self.skipped_lines = 0
        if self.path.exists() and not self.path.is_file():
            raise VlctlError(f"{self.path}: tree cache must be a JSONL file, not a directory")
        if self.path.exists():
            self._read()

    def _read(self) -> None:
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        for i, raw in enumerate(lines):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
                self._entries[row["key"]] = (row["caption"], row["tree"])
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
                self.skipped_lines += 1
                last = i == len(lines) - 1
                warnings.warn(f"{self.path}: {'truncated last' if last else 'corrupt'} line {i + 1} ignored",
                              stacklevel=3)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, caption: str) -> list | None:
        hit = self._entries.get(key)
        return hit[1] if hit is not None and hit[0] == caption else None

    def put(self, key: str, caption: str, tree: list) -> None:
        line = (json.dumps({"key": key, "caption": caption, "tree": tree}, ensure_ascii=False) + "\n").encode("utf-8")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # after a truncated line: start our own
            os.write(fd, line)
        finally:
            os.close(fd)
        self._entries[key] = (caption, tree)


class TreeGenerator:
    """Builds 3VL caption trees (see the module docstring).

    seed        : picks among the candidates of a stage (with a hash of the caption)
    opposites   : domain table {word: [replacements]}; its entries come before the curated ones
    vocabulary  : when given, every replacement word must be in it (a synthetic dataset's words)
    mlm         : optional masked-LM generator (caption tokens, token index) -> candidate words
    wordnet_dir : WordNet folder; default $VLCTL_WORDNET_DIR, nltk_data, /usr/share/wordnet
    use_wordnet : False skips WordNet (curated tables only)
    pos         : coarse spaCy POS tags that get negatives
    cache_path  : JSONL tree cache (TreeCache)
    max_words   : longer captions are refused

    `tree(caption)` -> [{"positive": str, "negatives": [str], "negative_pos": [str]}, ...];
    with details=True each level also has "replaced" [[word, replacement, pos, stage]] and
    "missed" [[word, pos]] (tokens for which no stage had a candidate).
    """

    def __init__(self, seed: int = 0, opposites: Mapping[str, Sequence[str]] | None = None,
                 vocabulary: Iterable[str] | None = None, mlm: Callable[[list[str], int], list[str]] | None = None,
                 wordnet_dir: str | os.PathLike | None = None, use_wordnet: bool = True,
                 pos: Sequence[str] = TREE_POS, cache_path: str | os.PathLike | None = None,
                 max_words: int = MAX_WORDS):
        self.seed = seed
        self.opposites = opposites
        self.vocabulary = vocabulary
        self.mlm = mlm
        self.wordnet_dir = wordnet_dir
        self.use_wordnet = use_wordnet
        self.pos = pos
        self.cache_path = cache_path
        self.max_words = max_words
        self._ready = False

    # state derived from the hyperparameters on first use
    def _prepare(self) -> None:
        if self._ready:
            return
        self.table_ = dict(OPPOSITES)
        for word, repl in (self.opposites or {}).items():
            if not isinstance(word, str) or isinstance(repl, str) or not all(isinstance(r, str) for r in repl):
                raise VlctlError(f"opposites: entry {word!r}: {repl!r} must map a word to a list of words")
            bad = [r for r in [word, *repl] if not _WORD.match(r.lower())]
            if bad:
                raise VlctlError(f"opposites: entry {word!r} has non-word(s) {bad}; a negative replaces one word "
                                 "by one word (lowercase letters only)")
            # a domain entry replaces the curated one for that word (its words are the domain's)
            self.table_[word.lower()] = tuple(dict.fromkeys([r.lower() for r in repl]))
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
            "spacy": _nlp_id(),
            "tables": hashlib.sha256(json.dumps([sorted(OPPOSITES.items()), sorted(CLOSED_CLASS.items())])
                                     .encode()).hexdigest()[:16],
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

    def _stages(self, lower: str, tag: str, pos: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Context-free candidate lists per stage for one word (cached): [(stage, words)]."""
        key = (lower, tag, pos)
        hit = self._stage_cache.get(key)
        if hit is not None:
            return hit
        wn = self.wn_
        base = wnmod.base_form(wn, lower, pos) if wn is not None else _crude_base(lower, tag)

        def inflect(words: Iterable[str]) -> tuple[str, ...]:
            if pos == "NOUN" and tag == "NNS":
                words = [pluralize(w) for w in words]
            elif pos == "VERB" and tag in ("VBG", "VBZ", "VBD", "VBN"):
                words = [inflect_verb(w, tag) for w in words]
            return tuple(words)

        out = []
        if lower in self.table_:
            out.append(("table", self.table_[lower]))
        elif base in self.table_:
            out.append(("table", inflect(self.table_[base])))
        if wn is not None:
            out.append(("antonym", inflect(wnmod.antonyms(wn, base, pos))))
            out.append(("co_hyponym", inflect(wnmod.co_hyponyms(wn, base, pos))))
        out.append(("mlm", ()))  # context-dependent: filled per token
        out.append(("closed_class", CLOSED_CLASS.get(pos, ())))
        res = tuple((stage, tuple(w for w in words if w != lower and w != base and _WORD.match(w)))
                    for stage, words in out)
        self._stage_cache[key] = res
        return res

    def _replace(self, doc, i: int, caption: str, seed: int, render: Callable[[str], str],
                 positives: set[str]) -> tuple[str, str, str] | None:
        """(negative text, replacement word, stage) for token i, or None when no stage has one."""
        tok = doc[i]
        lower = tok.text.lower()
        h = _hash_int(seed, caption, i)
        for stage, words in self._stages(lower, tok.tag_, tok.pos_):
            if stage == "mlm":
                if self.mlm is None:
                    continue
                words = tuple(w.strip().lower() for w in self.mlm([t.text for t in doc], i))
                words = tuple(w for w in dict.fromkeys(words) if w != lower and _WORD.match(w))
            if self.vocab_ is not None:
                words = tuple(w for w in words if w in self.vocab_)
            n = len(words)
            for k in range(n):
                word = words[(h + k) % n]
                text = render(_match_case(word, tok.text))
                if text not in positives:
                    return text, word, stage
        return None

    # -- trees --

    def _levels(self, doc, caption: str, lead: int) -> list[list[tuple[int, int]]]:
        """Levels as lists of character pieces of `caption`, joined by " and " when several."""
        chunks = [c for c in doc.noun_chunks if not (len(c) == 1 and c.root.pos_ == "PRON")]
        levels: list[list[tuple[int, int]]] = []
        if chunks:
            levels.append([(lead + chunks[0].start_char, lead + chunks[0].end_char)])
            for c in chunks[1:]:
                levels.append(levels[-1] + [(lead + c.start_char, lead + c.end_char)])
                levels.append([(lead, lead + c.end_char)])
        levels.append([(0, len(caption))])
        return levels

    def _build(self, doc, caption: str, seed: int) -> list[dict]:
        lead = len(caption) - len(caption.lstrip())
        pieces_per_level = self._levels(doc, caption, lead)
        texts = [" and ".join(caption[a:b] for a, b in pieces) for pieces in pieces_per_level]
        # Consecutive levels with the same words ("a cat on a mat" then "a cat on a mat.") are one
        # level; the later one is kept, so the last level is always the caption itself.
        words = [_ALNUM.findall(t) for t in texts]
        keep = [k for k in range(len(texts)) if k == len(texts) - 1 or words[k] != words[k + 1]]
        pieces_per_level = [pieces_per_level[k] for k in keep]
        texts = [texts[k] for k in keep]
        positives = set(texts)
        done: set[int] = set()
        tree = []
        for pieces, text in zip(pieces_per_level, texts):
            level = {"positive": text, "negatives": [], "negative_pos": [], "replaced": [], "missed": []}
            for p, (a, b) in enumerate(pieces):
                for tok in doc:
                    s = lead + tok.idx
                    if not (a <= s and s + len(tok.text) <= b) or tok.i in done:
                        continue
                    done.add(tok.i)
                    if tok.pos_ not in self.pos_ or not tok.is_alpha or tok.lower_ in _COPULA:
                        continue

                    n = len(tok.text)

                    def render(word: str, pieces=pieces, p=p, s=s, n=n) -> str:
                        parts = [caption[x:y] for x, y in pieces]
                        parts[p] = caption[pieces[p][0]:s] + word + caption[s + n:pieces[p][1]]
                        return " and ".join(parts)

                    got = self._replace(doc, tok.i, caption, seed, render, positives)
                    if got is None:
                        level["missed"].append([tok.text, tok.pos_])
                        continue
                    neg, word, stage = got
                    if neg in level["negatives"]:
                        continue
                    level["negatives"].append(neg)
                    level["negative_pos"].append(tok.pos_)
                    level["replaced"].append([tok.text, word, tok.pos_, stage])
            tree.append(level)
        return tree

    @staticmethod
    def _public(tree: list[dict], details: bool) -> list[dict]:
        if details:
            return tree
        return [{"positive": lv["positive"], "negatives": list(lv["negatives"]),
                 "negative_pos": list(lv["negative_pos"])} for lv in tree]

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
        if errors not in ("raise", "skip"):
            raise VlctlError(f"errors must be 'raise' or 'skip', got {errors!r}")
        self._prepare()
        s = self.seed if seed is None else seed
        out: list[list[dict] | None] = [None] * len(captions)
        todo: list[int] = []
        for k, cap in enumerate(captions):
            try:
                self.check(cap, f"caption {k}" if len(captions) > 1 else "caption")
            except VlctlError:
                if errors == "raise":
                    raise
                continue
            hit = self.cache_.get(self.cache_key(cap, s), cap) if self.cache_ is not None else None
            if hit is not None:
                out[k] = self._public(hit, details)
            else:
                todo.append(k)
        docs = self.nlp_.pipe((captions[k].strip() for k in todo), batch_size=batch_size)
        for k, doc in zip(todo, docs):
            tree = self._build(doc, captions[k], s)
            if self.cache_ is not None:
                self.cache_.put(self.cache_key(captions[k], s), captions[k], tree)
            out[k] = self._public(tree, details)
        return out

    def random_negative(self, caption: str, seed: int | None = None) -> tuple[str, str] | None:
        """One rule-based one-word negative of the whole caption: the NegCLIP-style baseline.

        The tokens of the tree POS classes are tried in a seeded random order; the first one with
        a replacement gives (negative caption, its POS). None when no token has one.
        """
        self._prepare()
        self.check(caption)
        s = self.seed if seed is None else seed
        lead = len(caption) - len(caption.lstrip())
        doc = self.nlp_(caption.strip())
        cands = [t for t in doc if t.pos_ in self.pos_ and t.is_alpha and t.lower_ not in _COPULA]
        cands.sort(key=lambda t: _hash_int("random_negative", s, caption, t.i))
        for tok in cands:
            start, n = lead + tok.idx, len(tok.text)

            def render(word: str, start=start, n=n) -> str:
                return caption[:start] + word + caption[start + n:]

            got = self._replace(doc, tok.i, caption, s, render, {caption})
            if got is not None:
                return got[0], tok.pos_
        return None


def _crude_base(lower: str, tag: str) -> str:
    """Base form without WordNet (curated-table lookups only): drop a plural -s."""
    if tag == "NNS" and lower.endswith("s") and not lower.endswith("ss"):
        return lower[:-1]
    return lower


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
