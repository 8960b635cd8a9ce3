"""Prompt lookup: proposals that cost no inference, read off the answer's own history (prompt and tokens so far).

Code-editing answers copy long runs of their prompt: where the last few tokens occurred before, the tokens that
followed them then are a good guess of what follows now. The own engine (engines/exact.py) tries this first and
asks its draft model only where the lookup has nothing; the main verifies either alike, so the answer stays
the main's (a lookup's proposal is a draft whose q is one-hot: engines/acceptance.py, accept_fixed).
"""

from __future__ import annotations

MIN_NGRAM = 2  # a single token recurs too often to say anything about what follows it
# Tokens proposed at most: verifying 9 tokens costs the real main ~1.2x one on AVX-512 but ~2.4x on AVX2
# (docs/benchmark.md#prompt-lookup); runs copied from a prompt are often longer.
LOOKUP_TOKENS = 8


class PromptLookup:
    """The history's n-grams (MIN_NGRAM to max_ngram tokens), each mapped to the position after its latest
    occurrence, kept as tokens come: a proposal is a dictionary look-up, not a scan of the history."""

    def __init__(self, history: list[int], *, max_ngram: int = 3, length: int = LOOKUP_TOKENS):
        self.sizes = range(max(max_ngram, MIN_NGRAM), MIN_NGRAM - 1, -1)  # longest first
        self.length = length
        self.history: list[int] = []
        self.follows: dict[tuple[int, ...], int] = {}
        self.extend(history)

    def extend(self, tokens: list[int]) -> None:
        """Tokens added to the history: each completes the n-grams that end just before it."""
        history, follows = self.history, self.follows
        for token in tokens:
            end = len(history)
            for n in self.sizes:
                if end >= n:
                    follows[tuple(history[end - n:end])] = end
            history.append(token)

    def propose(self, limit: int) -> list[int]:
        """What followed the latest earlier occurrence of the history's last n tokens (the longest n that
        occurred), up to `limit` and the lookup's length; [] where none did."""
        history = self.history
        for n in self.sizes:
            if len(history) > n and (start := self.follows.get(tuple(history[-n:]))) is not None:
                return history[start:start + min(limit, self.length)]
        return []
