"""Tokenizers for TinyCLIP's text towers.

`WordTokenizer` is the tokenizer of the small from-scratch text transformer: a closed vocabulary of
word tokens, where one token may span several words ("no swelling" is ONE token, as in the TEVI
paper's MAD CLIP whose vocabulary is the 26 attribute values + start/end). Text is lowercased and
split into words (runs of letters, digits, underscores or apostrophes); everything else ('-', ',',
'.', ...) only separates words and is dropped. Words are matched to tokens greedily, longest
multi-word token first, so "no swelling" becomes the one token "no swelling" and never "no" +
"swelling".

Token ids: 0 = <pad>, 1 = <start>, 2 = <end>, then the vocabulary in the order given. A text
becomes `<start> t1 .. tk <end> <pad> .. <pad>` of length `context_length`.

`MiniLMTokenizer` (encoders/minilm.py) wraps the WordPiece tokenizer of the frozen all-MiniLM-L6-v2
text tower with the same call signature (texts -> LongTensor (n, context_length), pad id 0). This
module imports nothing else from vlctl.encoders.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import torch

from vlctl.fsops import VlctlError

PAD, START, END = "<pad>", "<start>", "<end>"
SPECIALS = (PAD, START, END)
PAD_ID, START_ID, END_ID = 0, 1, 2

_WORD = re.compile(r"[\w']+")


def split_words(text: str, lowercase: bool = True) -> list[str]:
    """The words of `text`: runs of letters/digits/'_'/"'"; punctuation and '-' are separators."""
    return _WORD.findall(text.lower() if lowercase else text)


def as_text_list(texts: str | Sequence[str], what: str) -> list[str]:
    if isinstance(texts, str):
        return [texts]
    texts = list(texts)
    if not texts:
        raise VlctlError(f"{what}: got an empty list of texts")
    for t in texts:
        if not isinstance(t, str):
            raise VlctlError(f"{what}: expected strings, got {type(t).__name__} ({t!r})")
    return texts


class WordTokenizer:
    """Closed-vocabulary word tokenizer with multi-word tokens.

    Args:
        vocab: the word tokens (without the special tokens), e.g. the 26 MAD attribute values.
            A token may contain several words ("no swelling"); its punctuation is ignored the
            same way as in texts. Duplicates (after normalisation) are an error.
        context_length: length of every token row, <start> and <end> included.
        lowercase: lowercase vocabulary and texts before matching (default True).

    Calling the tokenizer on a list of n texts returns a LongTensor (n, context_length). A word
    that no token covers, or a text with more than context_length - 2 tokens, raises VlctlError
    naming the text and the word; so does an empty list.
    """

    def __init__(self, vocab: Sequence[str], context_length: int, lowercase: bool = True):
        self.lowercase = bool(lowercase)
        self.context_length = int(context_length)
        if self.context_length < 2:
            raise VlctlError(f"WordTokenizer: context_length must be >= 2 (<start> and <end>), got {context_length}")
        self.vocab: tuple[str, ...] = tuple(vocab)
        self.id_to_token: list[str] = list(SPECIALS)
        self._token_of_words: dict[tuple[str, ...], int] = {}
        for tok in self.vocab:
            if not isinstance(tok, str):
                raise VlctlError(f"WordTokenizer: vocabulary entries must be strings, got {tok!r}")
            if tok in SPECIALS:
                raise VlctlError(f"WordTokenizer: {tok!r} is a reserved special token")
            words = tuple(split_words(tok, self.lowercase))
            if not words:
                raise VlctlError(f"WordTokenizer: vocabulary token {tok!r} contains no word")
            if words in self._token_of_words:
                other = self.id_to_token[self._token_of_words[words]]
                raise VlctlError(
                    f"WordTokenizer: vocabulary tokens {other!r} and {tok!r} are the same after normalisation"
                )
            self._token_of_words[words] = len(self.id_to_token)
            self.id_to_token.append(tok)
        self.token_to_id: dict[str, int] = {t: i for i, t in enumerate(self.id_to_token)}
        self._max_words = max((len(w) for w in self._token_of_words), default=1)
        self._rows: dict[str, list[int]] = {}  # memo: text -> token row

    @property
    def vocab_size(self) -> int:
        """Number of embeddings the text tower needs: the vocabulary plus <pad>, <start>, <end>."""
        return len(self.id_to_token)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"WordTokenizer(vocab_size={self.vocab_size}, context_length={self.context_length})"

    @classmethod
    def from_texts(
        cls,
        texts: Iterable[str],
        context_length: int | None = None,
        separator: str | None = " - ",
        lowercase: bool = True,
    ) -> WordTokenizer:
        """Build a tokenizer whose vocabulary covers `texts`.

        With a `separator` (default ' - ', the MAD caption format) each separated part becomes one
        token, so multi-word values like "no swelling" stay one token; with `separator=None` every
        word is a token. The vocabulary is sorted (independent of the order of the data).
        `context_length` defaults to the longest text's token count + 2.
        """
        texts = list(texts)
        parts: set[tuple[str, ...]] = set()
        for text in texts:
            if separator is None:
                pieces = [(w,) for w in split_words(text, lowercase)]
            else:
                pieces = [tuple(split_words(p, lowercase)) for p in text.split(separator)]
                pieces = [p for p in pieces if p]
            parts.update(pieces)
        if not texts:
            raise VlctlError("WordTokenizer.from_texts: got no texts")
        vocab = sorted(" ".join(p) for p in parts)
        if context_length is None:
            # Greedy longest-match may segment differently from the separator (overlapping
            # parts), so measure with the real encoder.
            probe = cls(vocab, 2, lowercase)
            context_length = max(len(probe.encode(t)) for t in texts) + 2
        return cls(vocab, context_length, lowercase)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` without <start>/<end>/<pad>."""
        words = split_words(text, self.lowercase)
        ids: list[int] = []
        i = 0
        while i < len(words):
            for n in range(min(self._max_words, len(words) - i), 0, -1):
                tid = self._token_of_words.get(tuple(words[i : i + n]))
                if tid is not None:
                    ids.append(tid)
                    i += n
                    break
            else:
                raise VlctlError(
                    f"tokenizer: unknown word {words[i]!r} in text {text!r} "
                    f"(vocabulary of {len(self.vocab)} tokens: {list(self.vocab)[:30]}"
                    f"{' ...' if len(self.vocab) > 30 else ''})"
                )
        return ids

    def decode(self, ids: Sequence[int] | torch.Tensor) -> list[str]:
        """Token ids -> the vocabulary tokens, special tokens dropped."""
        if torch.is_tensor(ids):
            ids = ids.tolist()
        return [self.id_to_token[i] for i in ids if i >= len(SPECIALS)]

    def __call__(self, texts: str | Sequence[str]) -> torch.Tensor:
        texts = as_text_list(texts, "tokenizer")
        rows = []
        for text in texts:
            row = self._rows.get(text)
            if row is None:
                ids = self.encode(text)
                if len(ids) + 2 > self.context_length:
                    raise VlctlError(
                        f"tokenizer: text {text!r} has {len(ids)} tokens, more than context_length - 2 = "
                        f"{self.context_length - 2}; the first token past the limit is word "
                        f"{self.id_to_token[ids[self.context_length - 2]]!r}"
                    )
                row = [START_ID, *ids, END_ID] + [PAD_ID] * (self.context_length - len(ids) - 2)
                if len(self._rows) >= 100_000:  # captions repeat a lot; keep the memo bounded
                    self._rows.clear()
                self._rows[text] = row
            rows.append(row)
        return torch.tensor(rows, dtype=torch.long)

    def to_dict(self) -> dict:
        """What `save_pretrained` records: the full id table, so a changed tokenizer is detected."""
        return {
            "type": "word",
            "id_to_token": list(self.id_to_token),
            "context_length": self.context_length,
            "lowercase": self.lowercase,
        }
