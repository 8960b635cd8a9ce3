"""Who proposes a step's tokens on the own engine: the prompt lookup (proposers/prompt_lookup.py) where the answer's
history has a match, at no inference, else the draft model, as llama.cpp chains its --spec-type drafters. The main
verifies either alike (engines/own/engine.py), so the answer stays the main's.

With a stop (`DecodingParams.draft_stop_below`: the planner sets it where the host's calibration measured the Ks
with it) the draft proposes up to K tokens and stops at the first it gives a probability below it: that token is
held back, as the main would likely refuse it and the tokens after it. A larger K then pays where the host's verify
of many tokens costs little more than one (docs/speculation.md#where-the-draft-stops). Whether a step
stops is the draft's own business, decided before the main sees anything, so the answer stays the main's.

The draft's cache follows the answer lazily: the tokens it has not seen (those of the lookup's steps, the last
accepted proposal, the steps it sat out) wait in a backlog and are fed in one inference the next time it proposes.
Each drafter proposes only while it pays for itself in this answer (engines/own/payoff.py), and the draft, given the
host's costs, no more tokens a step than this answer's acceptance pays for (engines/own/step_length.py).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from inference.engines.decoding import DecodingParams
from inference.engines.grammar.constraint import TokenConstraint, masked
from inference.engines.own.acceptance import draw, probabilities
from inference.engines.own.batch import BatchRow
from inference.engines.own.kv_cache import KvCache, KvSequence
from inference.engines.own.payoff import Payoff
from inference.engines.own.proposers.prompt_lookup import PromptLookup
from inference.engines.own.step_length import StepLength
from inference.limits import Drafter


class Proposal(NamedTuple):
    """A step's proposed tokens and what the rule and the grammar need of them."""

    tokens: list[int]
    drafter: Drafter
    qs: list[np.ndarray]  # the draft's q each token was drawn from (sampled draft proposals; else none)
    masks: list[np.ndarray]  # what the grammar allowed before each token (under a grammar; else none)
    held_back: bool = False  # the draft stopped unsure: it was fed the last proposal to find the token it held back


class Drafting:
    """One answer's proposers: the draft model on its own cache, and the prompt lookup when it is on."""

    def __init__(self, draft: KvSequence, *, lookup: PromptLookup | None, params: DecodingParams,
                 rng: np.random.Generator, constraint: TokenConstraint | None, judged: bool = True):
        self.draft: KvCache = draft
        self.lookup = lookup
        self.stop_below = params.draft_stop_below
        self.params, self.rng, self.constraint = params, rng, constraint
        self.backlog: list[int] = []  # tokens the draft has not seen, before the last emitted one
        self.payoff = Payoff(judging=judged)  # judged: drafters sit out where they do not pay
        # A K per answer where the plan gave the host's costs; a draft that stops where unsure shortens its own steps
        self.step_length = (StepLength(params.step_costs)
                            if judged and params.step_costs and params.draft_stop_below is None else None)

    def prefill(self, prompt_ids: list[int]) -> None:
        self.draft.prefill(prompt_ids)

    def propose(self, *, k: int, room: int, last: int) -> Proposal:
        """The lookup's proposals (up to `room`) where it has a match the grammar allows, else up to k of the
        draft's; none from a drafter sitting out (the step is the main's alone). `last`: the last emitted token,
        which the draft is fed with its backlog."""
        if (self.lookup is not None and self.payoff.proposes(Drafter.NGRAM)
                and (looked_up := self._looked_up(room)).tokens):
            return looked_up
        if not self.payoff.proposes(Drafter.DRAFT):
            return Proposal([], Drafter.DRAFT, [], [])
        if self.step_length is not None:
            k = self.step_length.k(k)
        return self._drafted(k, [*self.backlog, last], threshold=self.stop_below)

    def settle(self, *, last: int, proposal: Proposal, accepted: int, token: int, seconds: float,
               verify_seconds: float) -> None:
        """After the main's verdict: what the draft must be fed next step, the history the lookup reads, and what
        the step delivered in the `seconds` it took, proposing included, `verify_seconds` of them the main's
        (engines/own/payoff.py)."""
        tokens = proposal.tokens
        # A step the draft held back its first token in cost a draft inference: the draft's step, not the main alone's
        self.payoff.record(proposal.drafter if tokens or proposal.held_back else None, tokens=accepted + 1,
                           seconds=seconds, verify_seconds=verify_seconds)
        if self.step_length is not None and proposal.drafter == Drafter.DRAFT:
            self.step_length.record(proposed=len(tokens), accepted=accepted)
        if self.lookup is not None:
            self.lookup.extend([*tokens[:accepted], token])
        seen = len(tokens) if proposal.held_back else len(tokens) - 1  # proposals the draft was fed, after `last`
        if proposal.drafter == Drafter.NGRAM or (not tokens and not proposal.held_back):
            self.backlog = [*self.backlog, last, *tokens[:accepted]]  # the draft saw none of them
        elif accepted == len(tokens):
            self.backlog = tokens[seen:]  # the last proposal, unless it was fed to find the token held back
        else:
            self.backlog = []
            self.draft.drop_last(seen - accepted)

    def rebuild(self, live_ids: list[int]) -> None:
        self.draft.rebuild(live_ids)
        self.backlog = []

    def stop(self) -> None:
        """The answer goes on without speculating (the main alone's batch): the draft is not fed again."""
        self.draft.close()

    def into_batch(self, row: BatchRow) -> None:
        """The answer speculates in the batch from now on (own/engine.py): its draft a row of the draft's batch, the
        cache it had copied in, proposing K tokens every step, so that the rows ask each batch together (a lookup's
        step, a stop or a drafter sitting out would send one row to the main while the others draft)."""
        assert isinstance(self.draft, KvSequence)
        row.adopt(self.draft.live_cache())
        self.draft.close()
        self.draft, self.lookup, self.step_length, self.stop_below = row, None, None, None
        self.payoff = Payoff(judging=False)

    def _looked_up(self, room: int) -> Proposal:
        """The lookup's proposals, cut before the first token the grammar refuses (its state follows them)."""
        tokens = self.lookup.propose(room) if self.lookup is not None else []
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

    def _drafted(self, k: int, feed: list[int], *, threshold: float | None) -> Proposal:
        """Up to k draft proposals, drawn from q (the draft's distribution, under the grammar if any; its argmax
        at temperature 0). Fewer once the grammar has ended, or where the draft's probability of its most likely
        token falls below `threshold`."""
        greedy = self.params.temperature == 0
        proposal = Proposal([], Drafter.DRAFT, [], [])
        for _ in range(k):
            if self.constraint and self.constraint.ended:
                break  # the grammar allows nothing after its end: the main says the last token alone
            row = self.draft.feed(feed)[-1]
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
