"""What a proposer gives the own engine: the one contract the prompt lookup (proposers/prompt_lookup.py) and the
draft model (proposers/draft_model.py) keep, as vLLM's spec_decode states its proposers' (a step's proposed tokens
and what the verifier needs of them). The chain that asks them in turn (proposers/chain.py, Drafting) holds them by it.

A step: `propose` up to `limit` tokens to follow the answer so far, whose last emitted token is `last` (a proposer
that has not read it takes it now); the main verifies them by the exact rule (engines/own/acceptance.py); then
`settle` tells every proposer what the main kept, whichever of them proposed, so each follows the answer."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from inference.limits import Drafter


class Proposal(NamedTuple):
    """A step's proposed tokens and what the rule and the grammar need of them."""

    tokens: list[int]
    drafter: Drafter
    qs: list[np.ndarray]  # the draft's q each token was drawn from (sampled draft proposals; else none)
    masks: list[np.ndarray]  # what the grammar allowed before each token (under a grammar; else none)
    held_back: bool = False  # the draft stopped unsure: it was fed the last proposal to find the token it held back


class Proposer(Protocol):
    """One of an answer's proposers: it guesses tokens, the main decides."""

    def propose(self, limit: int, *, last: int) -> Proposal:
        """Up to `limit` tokens to follow the answer (its last emitted token `last`), fewer or none where it has no
        better guess or the grammar refuses; a lookup's are one-hot (no `qs`), a sampled draft's come with theirs."""
        ...

    def settle(self, proposal: Proposal, *, last: int, accepted: int, token: int) -> None:
        """After the main's verdict on `proposal` (any proposer's): its first `accepted` tokens kept, then `token`
        the main's own, after `last`."""
        ...
