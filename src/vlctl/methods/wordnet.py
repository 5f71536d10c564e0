"""WordNet 3.0 through NLTK, offline, for the 3VL caption-tree negatives (docs/methods.md §3.1).

Where the database comes from, first match wins:

1. an explicit directory (`wordnet_dir=` argument, else the `VLCTL_WORDNET_DIR` environment
   variable): that directory only; if it holds no WordNet the caller falls back (with a warning);
2. a user's own NLTK data (`nltk.data.find("corpora/wordnet")`, a folder or wordnet.zip);
3. Debian's `wordnet-base` files in /usr/share/wordnet.

Debian's folder lacks the `lexnames` file NLTK's reader opens first. The 45 lexicographer file
names are fixed by WordNet 3.0, so the reader is given them from memory instead of a file. (A
folder of symlinks plus a written `lexnames` does not work with NLTK 3.10: its path sandbox
resolves every symlink and refuses targets outside the corpus root.) NLTK also refuses a corpus
root that is not under one of `nltk.data.path`, so the chosen root is appended there.

Nothing is ever downloaded. `load_wordnet` is cached per root, so the "WordNet not found" warning
is issued once per root and the ~2 s index load happens once per process.
"""

from __future__ import annotations

import functools
import io
import os
import re
import warnings
from pathlib import Path

DEBIAN_DIR = "/usr/share/wordnet"
ENV_VAR = "VLCTL_WORDNET_DIR"

# WordNet 3.0 lexicographer files, in file-number order ("NN\tname\tsyntactic category").
_LEXNAMES = (
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal", "noun.artifact", "noun.attribute",
    "noun.body", "noun.cognition", "noun.communication", "noun.event", "noun.feeling", "noun.food", "noun.group",
    "noun.location", "noun.motive", "noun.object", "noun.person", "noun.phenomenon", "noun.plant", "noun.possession",
    "noun.process", "noun.quantity", "noun.relation", "noun.shape", "noun.state", "noun.substance", "noun.time",
    "verb.body", "verb.change", "verb.cognition", "verb.communication", "verb.competition", "verb.consumption",
    "verb.contact", "verb.creation", "verb.emotion", "verb.motion", "verb.perception", "verb.possession",
    "verb.social", "verb.stative", "verb.weather", "adj.ppl",
)
_LEX_CATEGORY = {"adj": 3, "adv": 4, "noun": 1, "verb": 2}
LEXNAMES_TEXT = "".join(f"{i:02d}\t{n}\t{_LEX_CATEGORY[n.split('.')[0]]}\n" for i, n in enumerate(_LEXNAMES))

# spaCy coarse POS -> WordNet POS letters (adjective satellites 's' are looked up with 'a').
WN_POS = {"NOUN": "n", "VERB": "v", "ADJ": "a"}
_PLAIN = re.compile(r"^[a-z]+$")


def _has_wordnet(root: Path) -> bool:
    return (root / "data.noun").is_file() and (root / "index.noun").is_file()


def find_wordnet_root(wordnet_dir: str | os.PathLike | None = None):
    """The WordNet folder to read (a path or an NLTK zip pointer), or None when there is none.

    An explicit `wordnet_dir` (or $VLCTL_WORDNET_DIR) is the only place looked at when given.
    """
    explicit = wordnet_dir if wordnet_dir is not None else os.environ.get(ENV_VAR)
    if explicit is not None:
        root = Path(explicit).expanduser()
        return root.resolve() if _has_wordnet(root) else None
    try:
        import nltk.data

        return nltk.data.find("corpora/wordnet")  # never downloads; LookupError when absent
    except LookupError:
        pass
    debian = Path(DEBIAN_DIR)
    return debian.resolve() if _has_wordnet(debian) else None


_READERS: dict[str, object] = {}
_WARNED: set[str] = set()


def _open_reader(root):
    import nltk.data
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    class _Reader(WordNetCorpusReader):
        def open(self, fileid):
            if fileid == "lexnames" and not _exists(root, "lexnames"):
                return io.StringIO(LEXNAMES_TEXT)
            return super().open(fileid)

        def map_wn(self, version="wordnet"):
            # Maps other WordNet versions onto the loaded one for the multilingual (OMW) data,
            # which we never use; NLTK's version would go looking for nltk_data's wordnet.
            return None

    if isinstance(root, Path) and str(root) not in [str(p) for p in nltk.data.path]:
        nltk.data.path.append(str(root))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "multilingual functions are not available": expected
        return _Reader(str(root) if isinstance(root, Path) else root, None)


def _exists(root, name: str) -> bool:
    if isinstance(root, Path):
        return (root / name).is_file()
    try:
        root.join(name)  # an NLTK path pointer (folder or zip)
        return True
    except (OSError, KeyError, ValueError):
        return False


def load_wordnet(wordnet_dir: str | os.PathLike | None = None):
    """An NLTK WordNetCorpusReader, or None (with a warning, once per place looked) when absent."""
    root = find_wordnet_root(wordnet_dir)
    if root is None:
        where = wordnet_dir if wordnet_dir is not None else os.environ.get(ENV_VAR)
        looked = str(where) if where is not None else f"nltk_data and {DEBIAN_DIR}"
        if looked not in _WARNED:
            _WARNED.add(looked)
            warnings.warn(
                f"WordNet not found in {looked}; 3VL negatives fall back to the curated opposite tables "
                "(install Debian's wordnet-base or NLTK's wordnet corpus for antonyms and co-hyponyms)",
                stacklevel=3,
            )
        return None
    key = str(root)
    if key not in _READERS:
        _READERS[key] = _open_reader(root)
    return _READERS[key]


# --- lookups -----------------------------------------------------------------------------------


def base_form(wn, word: str, pos: str) -> str:
    """WordNet's morphological base ("kites" -> "kite", "flying" -> "fly"), or the word itself."""
    p = WN_POS.get(pos)
    if wn is None or p is None:
        return word
    try:
        forms = wn._morphy(word, p)  # every analysis: "hands" -> ["hands", "hand"]
    except AttributeError:  # pragma: no cover - older NLTK
        forms = [f for f in [wn.morphy(word, p)] if f]
    # An inflected surface that is also a lemma of its own ("hands" = control) is read as the
    # inflection: the plainer form is the word the caption means.
    shorter = [f for f in forms if f != word]
    return shorter[0] if shorter else (forms[0] if forms else word)


def _plain(name: str, exclude: str) -> bool:
    return bool(_PLAIN.match(name)) and name != exclude


def antonyms(wn, base: str, pos: str) -> list[str]:
    """Direct antonyms of any sense of `base`, then (adjective satellites) the antonyms of their
    cluster head ("indirect antonyms": wet-ish satellites -> dry). Sorted, plain single words."""
    p = WN_POS.get(pos)
    if wn is None or p is None:
        return []
    out: set[str] = set()
    synsets = wn.synsets(base, p)
    for s in synsets:
        for lemma in s.lemmas():
            if lemma.name().lower() == base:
                out.update(a.name() for a in lemma.antonyms())
    if not out and p == "a":
        for s in synsets[:1]:
            for head in s.similar_tos() if s.pos() == "s" else []:
                for lemma in head.lemmas():
                    out.update(a.name() for a in lemma.antonyms())
    return sorted(n for n in out if _plain(n, base))


def co_hyponyms(wn, base: str, pos: str) -> list[str]:
    """Sisters of the first sense of `base`: the other hyponyms of its first hypernym (by name,
    for determinism: NLTK's order is not stable across processes), one name
    each (the first plain single-word lemma), keeping only those with a SemCor count > 0 when
    there are any. Sorted.

    First senses, as 3VL does ("dog" -> other canines). Two widenings, for words WordNet leaves
    without sisters: the first of the first three senses that has a hypernym is used (verbs at
    the top of the hierarchy have none: "hold" = keep.v.01), and a sense whose hypernym has no
    other hyponym ("baseball" under ball_game) takes the sisters of that hypernym instead
    ("football", "hockey" under field_game). Adjectives have no hypernyms: none here.
    """
    p = WN_POS.get(pos)
    if wn is None or p not in ("n", "v"):
        return []
    first, hypers = None, []
    for s in wn.synsets(base, p)[:3]:
        hypers = _hypernyms(s)
        if hypers:
            first = s
            break
    if not hypers:
        return []
    names = _sisters(wn, first, hypers[0], base)
    if not names:
        grand = _hypernyms(hypers[0])
        if grand:
            names = _sisters(wn, hypers[0], grand[0], base)
    # Sisters seen in the sense-tagged corpus (SemCor counts) are the everyday words; the rest
    # are mostly obscure ("kite" -> "giro"), which make easy negatives. Use them only if needed.
    common = [n for n, c in names.items() if c > 0]
    return sorted(common or names)


def _hypernyms(synset) -> list:
    # NLTK keeps a synset's pointers in a set, so the order of hypernyms() changes with Python's
    # per-process string hashing; sorting by name makes "the first hypernym" the same everywhere.
    return sorted(synset.hypernyms() or synset.instance_hypernyms(), key=lambda h: h.name())


def _sisters(wn, synset, parent, base: str) -> dict[str, int]:
    counts = sense_counts(wn)
    names: dict[str, int] = {}
    for sister in parent.hyponyms() + parent.instance_hyponyms():
        if sister == synset:
            continue
        for lemma in sister.lemmas():
            name = lemma.name()
            if _plain(name, base):
                names[name] = max(names.get(name, 0), counts.get(lemma.key(), 0))
                break
    return names


@functools.lru_cache(maxsize=4)
def sense_counts(wn) -> dict[str, int]:
    """SemCor tag counts by sense key, read once from cntlist.rev ("key sense_number count"
    per line); NLTK's Lemma.count() binary-searches the file on every call, 1000x slower."""
    counts: dict[str, int] = {}
    try:
        with wn.open("cntlist.rev") as fp:
            for line in fp:
                parts = line.split()
                if len(parts) == 3:
                    counts[parts[0]] = int(parts[2])
    except (OSError, ValueError):
        pass  # no counts: every sister counts as obscure, so all are kept
    return counts


@functools.lru_cache(maxsize=4)
def lemma_names(wn) -> frozenset[str]:
    """Every single-word lemma in WordNet, lowercased (for the is-this-English heuristic)."""
    if wn is None:
        return frozenset()
    return frozenset(n.lower() for n in wn.all_lemma_names() if "_" not in n)
