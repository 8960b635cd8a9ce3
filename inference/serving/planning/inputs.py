"""What a plan is made from, as plain values: what the request asked (`Asked`), the pair's answers running on this
worker (`Load`), what its engines delivered lately (`LiveFigures`), what the pair's calibration measured on its host
(`HostFigures`), and the four together with the pair (`Situation`), which the rules read."""

from __future__ import annotations

from dataclasses import dataclass, field

from inference.models import ModelPair
from inference.serving.rates import StepRates

# From this many prompt tokens a lone answer plans by what the host's calibration measured after a long prompt
# (calibration/measure.py, LONG_CONTEXT): halfway, in tokens, between its short prompts and its long one; where the
# calibration found the main alone faster after the long prompt, from where the gain it measured falls to nothing
# (HostFigures.long_context_from).
LONG_CONTEXT_FROM = 1000


@dataclass(frozen=True, kw_only=True)
class Asked:
    """What the request asked for about speculation (None: the pair decides)."""

    speculative: bool = True
    k: int | None = None
    threshold: float | None = None
    sampled: bool = False
    constrained: bool = False  # the output is held to a grammar (response_format, regex, grammar)
    alternatives: bool = False  # top_logprobs: each position's most likely tokens, which only the own engine gives
    prompt_tokens: int = 0  # the answer's context so far (the worker knows it): a long one plans by its own figures

    @property
    def left_to_the_pair(self) -> bool:
        """A greedy request that leaves speculation and K to the pair, held to no grammar: the only kind whose K
        may follow the load (the profile and the live figures are measured without a grammar)."""
        return (self.speculative and not self.sampled and not self.constrained and self.k is None
                and self.threshold is None)


@dataclass(frozen=True, kw_only=True)
class Load:
    """The pair's answers on this worker as a request joins: `streams`, the request included, and of those
    running, how many are on the library's speculative pipeline and on its main alone."""

    streams: int
    running_speculative: int = 0
    running_alone: int = 0


@dataclass(frozen=True, kw_only=True)
class LiveFigures:
    """What this worker's engines delivered lately at the load, {K: tokens/s} (0: the main alone), and whether
    requests joining should try the path it has no figure for there (StepRates.exploring)."""

    rates: dict[int, float]
    exploring: bool = False


def live_figures(rates: StepRates, *, asked: Asked, load: int) -> LiveFigures:
    """The figures a plan at this load reads; only requests whose K may follow the load explore."""
    return LiveFigures(rates=rates.at_load(load), exploring=asked.left_to_the_pair and rates.exploring(load))


@dataclass(frozen=True, kw_only=True)
class HostFigures:
    """What the pair's calibration measured on this worker's host (serving/calibrated.py): the configuration its
    main alone is fastest in, the one its own engine is exact in, and a lone answer's best K (0: the main alone)."""

    host: str  # the host, described
    main_alone_config: str = ""  # a precision configuration's name (serving/precision.py); "": not calibrated
    own_config: str = ""
    best_k: dict[int, int] = field(default_factory=dict)
    draft_stop_below: float | None = None  # the best K was measured with the draft stopping where unsure
    draft_alternative: bool = False  # the own engine loads the pair's draft in its other weight format: cheaper here
    step_costs: tuple[float, ...] = ()  # a draft token, then the verify of 2, 3, ... tokens, as shares of a main token
    long_step_costs: tuple[float, ...] = ()  # the same after the calibration's long prompt (LONG_CONTEXT_FROM on)
    batch_k: int = 0  # beyond the pair's speculating streams, answers speculate at this K in the own engine's batch
    long_context_k: int | None = None  # a lone answer's K after LONG_CONTEXT_FROM prompt tokens (0: the main alone)
    long_context_from: int = LONG_CONTEXT_FROM  # prompt tokens from which it applies

    @property
    def calibrated(self) -> bool:
        return bool(self.main_alone_config)

    def k_at(self, load: int) -> int | None:
        return self.best_k.get(load)  # it measures lone answers only: None beyond


@dataclass(frozen=True, kw_only=True)
class Situation:
    """Everything a plan reads: the pair, the request, the load, this worker's live figures and the host's
    calibration (None: not read, as for a pair the library's pipeline serves in the benchmark)."""

    pair: ModelPair
    asked: Asked
    load: Load
    live: LiveFigures | None = None
    host: HostFigures | None = None

    @property
    def streams(self) -> int:
        return self.load.streams

    @property
    def own_pair(self) -> bool:
        """The pair serves its first answers on its own engine (ModelPair.own_engine_streams)."""
        return bool(self.pair.own_engine_streams)

    @property
    def beyond_own_streams(self) -> bool:
        return self.own_pair and self.streams > self.pair.own_engine_streams

    @property
    def lone(self) -> bool:
        """Within the answers the pair speculates for on its own engine."""
        return self.own_pair and not self.beyond_own_streams

    @property
    def exact(self) -> bool:
        """A sampled answer held to the main's distribution: the own engine's rule (engines/own/engine.py)."""
        return self.asked.sampled and not self.pair.allow_inexact_sampling

    @property
    def calibrated(self) -> bool:
        return self.host is not None and self.host.calibrated

    @property
    def long_prompt(self) -> bool:
        return self.asked.prompt_tokens >= (self.host.long_context_from if self.host else LONG_CONTEXT_FROM)
