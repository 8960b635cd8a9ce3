"""Who proposes a step's tokens on the own engine: the prompt lookup (proposers/prompt_lookup.py) where the answer's
history has a match, at no inference, else the draft model (proposers/draft_model.py), as llama.cpp chains its
--spec-type drafters. Both keep one contract (proposers/interface.py, Proposer). The main verifies either alike
(engines/own/engine.py), so the answer stays the main's.

Each drafter proposes only while it pays for itself in this answer (engines/own/payoff.py), and the draft, given the
host's costs, no more tokens a step than this answer's acceptance pays for (engines/own/step_length.py).

An answer may speculate from its conversation alone, with no draft: after a long prompt where the host's calibration
found the draft not paying (`Speculation.lookup_only`), or while the draft has yet to read a pasted file (it reads
it once the answer is out: engines/own/engine.py). A lookup that misses costs nothing, so the step is the main alone's.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from inference.engines.decoding import DecodingParams, Speculation
from inference.engines.grammar.constraint import TokenConstraint
from inference.engines.own.kv_cache import PagedSequence
from inference.engines.own.payoff import Payoff
from inference.engines.own.penalty import RepetitionPenalty
from inference.engines.own.proposers.draft_model import DraftModel
from inference.engines.own.proposers.interface import Proposal, Proposer
from inference.engines.own.proposers.prompt_lookup import LookupProposer, PromptLookup
from inference.engines.own.step_length import StepLength
from inference.limits import Drafter


class Drafting:
    """One answer's proposers: the prompt lookup when it is on, and the draft model on its own cache unless the answer
    speculates from its conversation alone."""

    def __init__(self, draft: PagedSequence | None, *, lookup: PromptLookup | None, params: DecodingParams,
                 speculation: Speculation, rng: np.random.Generator, constraint: TokenConstraint | None,
                 penalty: RepetitionPenalty | None = None, judged: bool = True):
        self._draft_on = partial(DraftModel, params=params, stop_below=speculation.draft_stop_below, rng=rng,
                                 constraint=constraint, penalty=penalty)
        self.draft = self.new_draft(draft) if draft is not None else None
        self.lookup = LookupProposer(lookup, constraint) if lookup is not None else None
        self.payoff = Payoff(judging=judged)  # judged: drafters sit out where they do not pay
        # A K per answer where the plan gave the host's costs; a draft that stops where unsure shortens its own steps
        self.step_length = (StepLength(speculation.step_costs) if judged and speculation.step_costs
                            and speculation.draft_stop_below is None else None)

    def new_draft(self, cache: PagedSequence) -> DraftModel:
        """A draft on `cache`, as this answer's draft is made (one that joins later reads the answer so far first)."""
        return self._draft_on(cache)

    def proposers(self) -> list[Proposer]:
        """Those that follow the answer, the lookup first."""
        return [proposer for proposer in (self.lookup, self.draft) if proposer is not None]

    def prefill(self, prompt_ids: list[int]) -> None:
        if self.draft is not None:
            self.draft.prefill(prompt_ids)

    def leave_draft_behind(self) -> DraftModel | None:
        """The draft, no longer asked in this answer (the conversation's lookup goes on alone): it reads the
        conversation after the answer instead."""
        draft, self.draft = self.draft, None
        return draft

    def rejoin(self, draft: DraftModel) -> None:
        """The draft set aside at the answer's start (engines/own/engine.py), having read the answer so far, proposes
        from now on."""
        self.draft = draft

    def propose(self, *, k: int, room: int, last: int) -> Proposal:
        """The lookup's proposals (up to `room`) where it has a match the grammar allows, else up to k of the
        draft's; none from a drafter sitting out (the step is the main's alone). `last`: the last emitted token,
        which the draft is fed with its backlog."""
        if (self.lookup is not None and self.payoff.proposes(Drafter.NGRAM)
                and (looked_up := self.lookup.propose(room, last=last)).tokens):
            return looked_up
        if self.draft is None:
            return Proposal([], Drafter.NGRAM, [], [])  # the lookup had nothing: the main alone's step
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

    def stop_draft(self) -> None:
        """The answer goes on without the draft (in the batch): it is not fed again; the lookup, if any, goes on."""
        if self.draft is not None:
            self.draft.stop()
            self.draft = None
