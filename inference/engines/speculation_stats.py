"""The speculation figures of one generation: counted step by step (SpeculationStats) and summed up when it
ends (SpeculationFigures, whose field names FIGURES lists for every place that shows or stores them)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from inference.limits import Drafter


@dataclass(frozen=True)
class SpeculationFigures:
    """What one ended generation measured. The one list of these names: the Generation's columns, the
    stream's `done` event, the API's usage, the chat's metrics line and the Prometheus counters all
    take them from here. The speculative ones are None when no draft ran."""

    completion_tokens: int
    main_steps: int
    ttft_ms: float | None
    duration_ms: float
    tokens_per_s: float
    draft_tokens: int | None  # proposed by the draft (None in the confidence-threshold mode: not counted)
    accepted_tokens: int | None
    draft_steps: int | None  # main steps that verified a proposal (vLLM's count of drafts)
    acceptance_rate: float | None
    mean_accepted_length: float | None  # tokens per verifying step, the main's own included
    accepted_by_position: list[int]
    # Of the three counts above, the n-gram lookup's (Drafter.NGRAM); the rest are the draft model's.
    ngram_draft_tokens: int | None
    ngram_accepted_tokens: int | None
    ngram_draft_steps: int | None
    # Main steps of a speculating answer that verified no proposal: its drafters sat out where they did not pay
    # (engines/own/payoff.py), the lookup had no match, or one token was left.
    undrafted_steps: int | None


FIGURES = tuple(f.name for f in fields(SpeculationFigures))


@dataclass
class DrafterCounts:
    """One drafter's share of an answer's verifying steps, proposed tokens and accepted ones."""

    steps: int = 0
    proposed: int = 0
    accepted: int = 0


@dataclass
class SpeculationStats:
    """Counts per generation, from the tokens each main step delivered (and what proposed them, and how many,
    where the engine says: the own engine does)."""

    num_assistant_tokens: int | None  # K when fixed; None for the confidence-threshold mode or no draft
    speculative: bool
    max_new_tokens: int
    drafter: Drafter = Drafter.DRAFT  # what proposes where a step does not say (the library's)
    main_steps: int = 0
    tokens: int = 0
    accepted: int = 0
    proposed: int = 0
    draft_steps: int = 0  # main steps that verified the draft's proposal (not plain or prefill ones)
    undrafted_steps: int = 0  # steps of a speculating answer with nothing proposed (the engine said so)
    accepted_by_position: list[int] = field(default_factory=list)
    by_drafter: dict[Drafter, DrafterCounts] = field(default_factory=dict)
    first_token_at: float | None = None
    last_token_at: float | None = None
    prefill_steps: int = 0
    prefill_next: bool = True

    def add_step(self, n_tokens: int, at: float, *, drafter: Drafter | None = None,
                 proposed: int | None = None) -> None:
        """A main step's tokens; `drafter` and `proposed` where the engine says what proposed them and how many."""
        remaining = self.max_new_tokens - self.tokens
        self.main_steps += 1
        self.tokens += n_tokens
        self.first_token_at = self.first_token_at or at
        self.last_token_at = at
        if self.prefill_next:  # a prefill step has nothing to verify
            self.prefill_next = False
            self.prefill_steps += 1
            return
        if not self.speculative:
            return
        if proposed == 0:
            self.undrafted_steps += 1
            return
        accepted = n_tokens - 1
        if proposed is None:  # the draft proposes no more than the tokens left after the main's own one
            proposed = max(min(self.num_assistant_tokens, remaining - 1), accepted) if self.num_assistant_tokens else 0
        self.draft_steps += 1
        self.accepted += accepted
        self.proposed += proposed
        counts = self.by_drafter.setdefault(drafter or self.drafter, DrafterCounts())
        counts.steps += 1
        counts.proposed += proposed
        counts.accepted += accepted
        while len(self.accepted_by_position) < accepted:
            self.accepted_by_position.append(0)
        for position in range(accepted):
            self.accepted_by_position[position] += 1

    def hand_over(self, *, num_assistant_tokens: int | None, speculative: bool, drafter: Drafter = Drafter.DRAFT
                  ) -> None:
        """The answer goes on in another engine: its first step there prefills again."""
        self.num_assistant_tokens, self.speculative, self.drafter = num_assistant_tokens, speculative, drafter
        self.prefill_next = True

    def summary(self, *, started_at: float, ended_at: float) -> SpeculationFigures:
        decode_steps = max(self.main_steps - self.prefill_steps, 0)
        duration = max(ended_at - started_at, 1e-9)
        counted = self.speculative and bool(self.num_assistant_tokens)
        ngram = self.by_drafter.get(Drafter.NGRAM, DrafterCounts())
        return SpeculationFigures(
            completion_tokens=self.tokens,
            main_steps=self.main_steps,
            ttft_ms=(self.first_token_at - started_at) * 1000 if self.first_token_at else None,
            duration_ms=duration * 1000,
            tokens_per_s=self.tokens / duration if self.tokens else 0.0,
            draft_tokens=self.proposed if counted else None,
            accepted_tokens=self.accepted if self.speculative else None,
            draft_steps=self.draft_steps if self.speculative else None,
            acceptance_rate=(self.accepted / self.proposed) if self.proposed else None,
            mean_accepted_length=((self.tokens - self.prefill_steps) / decode_steps)
            if self.speculative and decode_steps else None,
            accepted_by_position=list(self.accepted_by_position) if self.speculative else [],
            ngram_draft_tokens=ngram.proposed if counted else None,
            ngram_accepted_tokens=ngram.accepted if self.speculative else None,
            ngram_draft_steps=ngram.steps if self.speculative else None,
            undrafted_steps=self.undrafted_steps if self.speculative else None,
        )
