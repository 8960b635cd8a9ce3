"""Who proposes a step's tokens on the own engine: the prompt lookup (proposers/prompt_lookup.py) where the answer's
history has a match, at no inference, else the draft model (proposers/draft_model.py), as llama.cpp chains its
--spec-type drafters. Both keep one contract (proposers/interface.py, Proposer). The main verifies either alike
(engines/own/engine.py), so the answer stays the main's.

Each drafter proposes only while it pays for itself in this answer (engines/own/payoff.py), and the draft, given the
host's costs, no more tokens a step than this answer's acceptance pays for (engines/own/step_length.py).
"""

from __future__ import annotations

import numpy as np

from inference.engines.decoding import DecodingParams
from inference.engines.grammar.constraint import TokenConstraint
from inference.engines.own.kv_cache import PagedSequence
from inference.engines.own.payoff import Payoff
from inference.engines.own.proposers.draft_model import DraftModel
from inference.engines.own.proposers.interface import Proposal, Proposer
from inference.engines.own.proposers.prompt_lookup import LookupProposer, PromptLookup
from inference.engines.own.step_length import StepLength
from inference.limits import Drafter


class Drafting:
    """One answer's proposers: the draft model on its own cache, and the prompt lookup when it is on."""

    def __init__(self, draft: PagedSequence, *, lookup: PromptLookup | None, params: DecodingParams,
                 rng: np.random.Generator, constraint: TokenConstraint | None, judged: bool = True):
        self.draft = DraftModel(draft, params=params, rng=rng, constraint=constraint)
        self.lookup = LookupProposer(lookup, constraint) if lookup is not None else None
        self.payoff = Payoff(judging=judged)  # judged: drafters sit out where they do not pay
        # A K per answer where the plan gave the host's costs; a draft that stops where unsure shortens its own steps
        self.step_length = (StepLength(params.step_costs)
                            if judged and params.step_costs and params.draft_stop_below is None else None)

    def proposers(self) -> list[Proposer]:
        """Those that follow the answer, the lookup first."""
        return [self.lookup, self.draft] if self.lookup is not None else [self.draft]

    def prefill(self, prompt_ids: list[int]) -> None:
        self.draft.prefill(prompt_ids)

    def propose(self, *, k: int, room: int, last: int) -> Proposal:
        """The lookup's proposals (up to `room`) where it has a match the grammar allows, else up to k of the
        draft's; none from a drafter sitting out (the step is the main's alone). `last`: the last emitted token,
        which the draft is fed with its backlog."""
        if (self.lookup is not None and self.payoff.proposes(Drafter.NGRAM)
                and (looked_up := self.lookup.propose(room, last=last)).tokens):
            return looked_up
        if not self.payoff.proposes(Drafter.DRAFT):
            return Proposal([], Drafter.DRAFT, [], [])
        if self.step_length is not None:
            k = self.step_length.k(k)
        return self.draft.propose(k, last=last)

    def settle(self, *, last: int, proposal: Proposal, accepted: int, token: int, seconds: float,
               verify_seconds: float) -> None:
        """After the main's verdict: what each proposer follows of the answer (proposers/interface.py), and what the
        step delivered in the `seconds` it took, proposing included, `verify_seconds` of them the main's
        (engines/own/payoff.py)."""
        tokens = proposal.tokens
        # A step the draft held back its first token in cost a draft inference: the draft's step, not the main alone's
        self.payoff.record(proposal.drafter if tokens or proposal.held_back else None, tokens=accepted + 1,
                           seconds=seconds, verify_seconds=verify_seconds)
        if self.step_length is not None and proposal.drafter == Drafter.DRAFT:
            self.step_length.record(proposed=len(tokens), accepted=accepted)
        for proposer in self.proposers():
            proposer.settle(proposal, last=last, accepted=accepted, token=token)

    def stop(self) -> None:
        """The answer goes on without speculating (the main alone's batch): the draft is not fed again."""
        self.draft.stop()
