"""Seeded synthetic text for THL benchmarks and tests (offline, no downloads, pure Python).

A mixture of English-like words (Zipf-distributed pseudo-words built from syllables, plus
common function words), numbers, punctuation, whitespace runs and some Unicode: accented Latin,
CJK, emoji, combining marks. Deterministic for a given seed.
"""

from __future__ import annotations

import itertools
import random

_FUNCTION_WORDS = ("the", "of", "and", "to", "in", "is", "that", "it", "for", "as", "with",
                   "was", "on", "be", "by", "this", "are", "from", "or", "an", "we", "so")
_ONSETS = ("b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
           "br", "ch", "cl", "dr", "gr", "pl", "pr", "sh", "st", "str", "th", "tr", "")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou", "io", "y")
_CODAS = ("", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "st", "ck", "rt", "ss")
_PUNCT = (".", ",", ";", ":", "!", "?", "(", ")", "-", "\"", "'", "=", "+", "/")
_UNICODE = ("café", "naïve", "Ölfeld", "über", "façade", "日本語", "中文", "テスト", "한국어",
            "🎉", "🚀", "👍🏽", "e\u0301", "a\u0308", "Ωmega", "π", "∑", "–", "…", "ﬁne", "Ｈｉ")


def _vocabulary(rng: random.Random, size: int) -> list[str]:
    words: set[str] = set()
    while len(words) < size:
        n = rng.choice((1, 2, 2, 3, 3, 4))
        words.add("".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                          for _ in range(n)))
    return sorted(words)


class TextGenerator:
    """Draws texts of roughly `n_words` words; same seed, same texts."""

    def __init__(self, seed: int = 0, vocab_size: int = 3000, unicode_rate: float = 0.03) -> None:
        self._rng = random.Random(seed)
        vocab = _vocabulary(self._rng, vocab_size)
        # Zipf weights make a few words frequent, like natural text.
        self._words = [*_FUNCTION_WORDS, *vocab]
        weights = [1.0 / (i + 1) ** 1.05 for i in range(len(self._words))]
        # Cumulative once: random.choices would rebuild it on every draw.
        self._cum_weights = list(itertools.accumulate(weights))
        self._unicode_rate = unicode_rate

    def _token(self) -> str:
        rng = self._rng
        r = rng.random()
        if r < self._unicode_rate:
            return rng.choice(_UNICODE)
        if r < self._unicode_rate + 0.06:
            return str(rng.randint(0, 10 ** rng.randint(1, 6)))
        word = rng.choices(self._words, cum_weights=self._cum_weights)[0]
        if rng.random() < 0.08:
            word = word.capitalize()
        return word

    def text(self, n_words: int) -> str:
        rng = self._rng
        parts: list[str] = []
        for _ in range(n_words):
            parts.append(self._token())
            r = rng.random()
            if r < 0.12:
                parts.append(rng.choice(_PUNCT))
            if r < 0.02:
                parts.append(rng.choice(("  ", "\n", "\n\n", "\t", "   ")))
            else:
                parts.append(" ")
        return "".join(parts).strip()

    def texts(self, count: int, min_words: int, max_words: int) -> list[str]:
        return [self.text(self._rng.randint(min_words, max_words)) for _ in range(count)]
