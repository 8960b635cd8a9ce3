"""The draft model as an answer's proposer (proposers/interface.py): up to K tokens drawn from its own distribution
q, on its own cache. The main verifies them (engines/own/engine.py), so the answer stays the main's.

With a stop (`Speculation.draft_stop_below`: the planner sets it where the host's calibration measured the Ks
with it) the draft proposes up to K tokens and stops at the first it gives a probability below it: that token is
held back, as the main would likely refuse it and the tokens after it. A larger K then pays where the host's verify
of many tokens costs little more than one (docs/speculation.md#where-the-draft-stops). Whether a step
stops is the draft's own business, decided before the main sees anything, so the answer stays the main's.

The draft's cache follows the answer lazily: the tokens it has not seen (those of the lookup's steps, the last
accepted proposal, the steps it sat out) wait in a backlog and are fed in one inference the next time it proposes.
"""

from __future__ import annotations

import numpy as np

from inference.engines.decoding import DecodingParams
from inference.engines.grammar.constraint import TokenConstraint, masked
from inference.engines.own.acceptance import draw, probabilities
from inference.engines.own.kv_cache import PagedSequence
from inference.engines.own.penalty import RepetitionPenalty
from inference.engines.own.proposers.interface import Proposal
from inference.limits import Drafter


class DraftModel:
    """The draft on its own sequence of the draft's blocks, fed lazily."""

    def __init__(self, cache: PagedSequence, *, params: DecodingParams, stop_below: float | None,
                 rng: np.random.Generator, constraint: TokenConstraint | None,
                 penalty: RepetitionPenalty | None = None):
        self.cache = cache
        self.penalty = penalty  # the answer's, shaping the draft's rows as the main's
        self.stop_below = stop_below
        self.params, self.rng, self.constraint = params, rng, constraint
        self.backlog: list[int] = []  # tokens the draft has not seen, before the last emitted one

    def prefill(self, prompt_ids: list[int]) -> None:
        self.cache.prefill(prompt_ids)

    def propose(self, limit: int, *, last: int) -> Proposal:
        """Up to `limit` proposals, the draft fed its backlog and `last` first."""
        return self._drafted(limit, [*self.backlog, last], threshold=self.stop_below)

    def settle(self, proposal: Proposal, *, last: int, accepted: int, token: int) -> None:
        """What the draft must be fed next step: the tokens it did not see, or its rejected proposals cut."""
        tokens = proposal.tokens
        seen = len(tokens) if proposal.held_back else len(tokens) - 1  # proposals the draft was fed, after `last`
        if proposal.drafter == Drafter.NGRAM or (not tokens and not proposal.held_back):
            self.backlog = [*self.backlog, last, *tokens[:accepted]]  # the draft saw none of them
        elif accepted == len(tokens):
            self.backlog = tokens[seen:]  # the last proposal, unless it was fed to find the token held back
        else:
            self.backlog = []
            self.cache.drop_last(seen - accepted)

    def stop(self) -> None:
        self.cache.close()

    def _drafted(self, k: int, feed: list[int], *, threshold: float | None) -> Proposal:
        """Up to k draft proposals, drawn from q (the draft's distribution, under the grammar if any; its argmax
        at temperature 0). Fewer once the grammar has ended, or where the draft's probability of its most likely
        token falls below `threshold`."""
        greedy = self.params.temperature == 0
        proposal = Proposal([], Drafter.DRAFT, [], [])
        for _ in range(k):
            if self.constraint and self.constraint.ended:
                break  # the grammar allows nothing after its end: the main says the last token alone
            row = self.cache.feed(feed)[-1]
            if self.penalty:
                row = self.penalty.row(row, proposal.tokens)
            allowed = self.constraint.allowed() if self.constraint else None
            if allowed is not None:
                row = masked(row, allowed)
            q = None if greedy else probabilities(row, self.params)
            if threshold is not None and confidence(row, q) < threshold:
                return proposal._replace(held_back=True)
            if allowed is not None:
                proposal.masks.append(allowed)
            if q is None:
                token = int(np.argmax(row))
            else:
                proposal.qs.append(q)
                token = draw(q, self.rng)
            if self.constraint:
                self.constraint.take(token)
            proposal.tokens.append(token)
            feed = [token]
        return proposal


def confidence(row: np.ndarray, q: np.ndarray | None) -> float:
    """The draft's probability of its most likely token: under q when it samples, else of its logits' softmax."""
    if q is not None:
        return float(q.max())
    return float(1.0 / np.exp(row - row.max()).sum())
