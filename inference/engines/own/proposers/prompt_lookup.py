"""Prompt lookup: proposals that cost no inference, read off the prompt (the conversation so far, in a chat).

Code-editing answers copy long runs of their prompt: where the answer's last few tokens occur in the prompt, the
tokens that follow them there are a good guess of what follows now. The own engine (proposers/chain.py) tries
this first and asks its draft model only where the lookup has nothing; the main verifies either alike, so the
answer stays the main's (a lookup's proposal is a draft whose q is one-hot: engines/own/acceptance.py, accept_fixed).

Only the prompt is looked up, not the answer's own earlier tokens: on the real pair such matches (a phrase said
twice, a variable named again) were kept for 0.7-1.5 tokens a step, too few to pay for the longer verification
and for feeding the draft what it skipped, where matches in the prompt were kept for 3-4 (docs/speculation.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from inference.engines.own.proposers.interface import Proposal
from inference.limits import Drafter

if TYPE_CHECKING:
    from inference.engines.grammar.constraint import TokenConstraint  # llguidance: loaded by the engine, not here

MIN_NGRAM = 2  # a single token recurs too often to say anything about what follows it
# From this many prompt tokens (a pasted file, a long conversation) two tokens recur by chance too often: a match
# needs three. After a 2,000-token file, two-token matches made the lookup a third of an answer's proposals, mostly
# refused (docs/speculation.md#long-conversations).
LONG_PROMPT = 1024
# Tokens proposed after a short match: on the real pair a fixed 8 beat 4 and 16 (verifying many more tokens costs the
# main more than a copied run usually gives back; docs/benchmark.md#prompt-lookup-chained-before-the-draft).
LOOKUP_TOKENS = 8
# A longer match is trusted further, as SuffixDecoding does (arXiv 2411.04975): as many tokens as the answer's tail
# matched the conversation, up to this. An answer copying a pasted file grows its steps 8, 17, 32 while it copies.
LONGEST_LOOKUP = 32
# In the own engine's batch the other answers' tokens wait for a lookup's verify, and on a host's few cores a batch's
# step costs nearly by the token: the lookup proposes there only where the answer copies (this many of its last
# tokens match the conversation), and no more than LOOKUP_TOKENS a step. On every match, four answers to questions
# about a paste had 390 tokens verified to keep 42 (docs/speculation.md#speculating-in-the-batch).
BATCH_MATCHED = 8


class PromptLookup:
    """The prompt's n-grams (MIN_NGRAM to max_ngram tokens), each mapped to the position after its latest
    occurrence there, indexed once: a proposal is a dictionary look-up of the history's last tokens, not a scan."""

    def __init__(self, prompt: list[int], *, max_ngram: int = 3, length: int = LOOKUP_TOKENS):
        shortest = MIN_NGRAM + (len(prompt) >= LONG_PROMPT)
        self.sizes = range(max(max_ngram, shortest), shortest - 1, -1)  # longest first
        self.length = length
        self.longest, self.least_matched = LONGEST_LOOKUP, 0
        self.history = list(prompt)
        self.follows: dict[tuple[int, ...], int] = {}
        for end in range(shortest, len(prompt)):  # the n-grams that end just before prompt[end]
            for n in self.sizes:
                if end >= n:
                    self.follows[tuple(prompt[end - n:end])] = end

    def extend(self, tokens: list[int]) -> None:
        """The answer's new tokens: the history's last tokens are what is looked up next."""
        self.history.extend(tokens)

    def batched(self) -> None:
        """The answer went into the own engine's batch: proposals only where it copies, short ones."""
        self.longest, self.least_matched = self.length, BATCH_MATCHED

    def unbatched(self) -> None:
        """The answer left the batch, alone again: proposals as long as the match, on any match."""
        self.longest, self.least_matched = LONGEST_LOOKUP, 0

    def propose(self, limit: int) -> list[int]:
        """What followed the latest occurrence in the prompt of the history's last n tokens (the longest n that
        occurred), as many tokens as the match ran (at least the lookup's length, at most LONGEST_LOOKUP) and up to
        `limit`; [] where none did."""
        history = self.history
        for n in self.sizes:
            if len(history) > n and (start := self.follows.get(tuple(history[-n:]))) is not None:
                matched = self._matched(start, n)
                if matched < self.least_matched:
                    return []
                length = min(max(self.length, matched), self.longest)
                return history[start:start + min(limit, length)]
        return []

    def _matched(self, start: int, n: int) -> int:
        """How many of the history's last tokens equal those before `start` (n of them are known to)."""
        history, matched = self.history, n
        while matched < min(start, LONGEST_LOOKUP) and history[start - 1 - matched] == history[-1 - matched]:
            matched += 1
        return matched


class LookupProposer:
    """The prompt lookup as an answer's proposer (proposers/interface.py): its proposals cut before the first token
    the grammar refuses (the grammar's state follows them), its history extended by what the main kept."""

    def __init__(self, lookup: PromptLookup, constraint: TokenConstraint | None):
        self.lookup, self.constraint = lookup, constraint

    def extend(self, tokens: list[int]) -> None:
        self.lookup.extend(tokens)

    def batched(self) -> None:
        self.lookup.batched()

    def unbatched(self) -> None:
        self.lookup.unbatched()

    def propose(self, limit: int, *, last: int) -> Proposal:
        tokens = self.lookup.propose(limit)
        if self.constraint is None:
            return Proposal(tokens, Drafter.NGRAM, [], [])
        kept: list[int] = []
        masks: list[np.ndarray] = []
        for token in tokens:
            if self.constraint.ended or not (allowed := self.constraint.allowed())[token]:
                break
            masks.append(allowed)
            self.constraint.take(token)
            kept.append(token)
        return Proposal(kept, Drafter.NGRAM, [], masks)

    def settle(self, proposal: Proposal, *, last: int, accepted: int, token: int) -> None:
        self.lookup.extend([*proposal.tokens[:accepted], token])
