"""What a plan decides, as values: a `Choice` (whether the answer speculates, at which K, and why: choice.py makes
it) and the `Plan` (where it runs: the route, its K, its K in the batch, and every reason: rules.py makes it)."""

from __future__ import annotations

from dataclasses import dataclass

from inference.engines.decoding import Speculation
from inference.limits import Route, SpeculativeMode
from inference.serving.reasons import Reason, Why, sentence


@dataclass(frozen=True, kw_only=True)
class Choice:
    """Whether the answer speculates and how, before any engine is chosen: the main alone (`alone`), a K, or the
    library's confidence threshold."""

    alone: bool = False
    k: int | None = None
    threshold: float | None = None
    draft_stop_below: float | None = None  # the own engine's draft holds back a token it is this unsure of
    lookup_only: bool = False  # the own engine's proposals come from the conversation alone, no draft inference
    batch_k: int | None = None  # its K once it runs in the own engine's batch (None: the main alone there)
    why: tuple[Why, ...] = ()
    measured_here: bool = False  # this worker's recent figures show this path clearly faster at the load


@dataclass(frozen=True, kw_only=True)
class Plan:
    """How an answer is served: the one value the worker, the engines' specs, the record and the API read."""

    route: Route
    sampled: bool = False  # the request samples (temperature > 0): the exact rule on the own engine
    k: int | None = None
    threshold: float | None = None
    draft_stop_below: float | None = None
    step_costs: tuple[float, ...] = ()  # the own engine's draft proposes up to K, what the answer's acceptance pays for
    batch_k: int | None = None  # the K it speculates at once it runs in the own engine's batch (None: the main alone)
    lookup_only: bool = False  # the own engine's proposals come from the conversation alone, no draft inference
    why: tuple[Why, ...] = ()
    measured_here: bool = False
    handed_over: bool = False  # the answer already moved once: it stays (each move costs a prefill)

    @property
    def mode(self) -> SpeculativeMode:
        """How the answer is served, as the API and the chat state it."""
        if self.route.is_main_alone():
            return SpeculativeMode.OFF
        if self.route == Route.PROMPT_LOOKUP or self.lookup_only:
            return SpeculativeMode.PROMPT_LOOKUP
        if not self.sampled:
            return SpeculativeMode.DRAFT
        return SpeculativeMode.EXACT_SAMPLING if self.route.is_own_engine() else SpeculativeMode.INEXACT_SAMPLING

    @property
    def speculation(self) -> Speculation | None:
        """The one value an engine is handed: how the answer speculates, none for a main alone."""
        if self.route.is_main_alone():
            return None
        return Speculation(k=self.k, threshold=self.threshold, draft_stop_below=self.draft_stop_below,
                           step_costs=self.step_costs, batch_k=self.batch_k, lookup_only=self.lookup_only)

    @property
    def reasons(self) -> tuple[Reason, ...]:
        return tuple(why.code for why in self.why)

    @property
    def reason(self) -> str:
        return sentence(self.why)
