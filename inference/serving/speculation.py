"""How a request is served — which route (limits.Route: which engine, drafting or not), which K, and why —
decided when it joins a worker's batch, from what it asked, the pair's settings, its calibration on the host
and measured profile, the worker's load then and its live figures: `plan` is a pure function of those;
`handover.py` moves a running answer.

Both sides use it: the web side to validate a request with the settings it would get, the worker to
decide for real (it knows its load). Two promises shape it: a sampled request runs on the own engine
(engines/own/engine.py), never on openvino-genai's inexact sampling with a draft unless the pair allows it
(and then says so); and where the main alone is faster at the current load, the main alone serves
(speculation must never slow answers). Faster by what this worker measured lately at that load
(serving/rates.py) where it measured both the main alone and a K there, else by the pair's profile;
where it measured only one of them at a load of 4 or more streams, it tries the other now and then.

Each decision says why as a `Reason` code with its figures (a `Why`, serving/reasons.py), from which the
sentence an answer shows is made; no decision reads the sentence.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from inference.limits import DEFAULT_K, Route, SpeculativeMode
from inference.models import ModelPair
from inference.pair_checks import profile_errors
from inference.serving import precision
from inference.serving.rates import StepRates
from inference.serving.reasons import Reason, Why, sentence

log = logging.getLogger(__name__)
# From this many prompt tokens a lone answer plans by what the host's calibration measured after a long prompt
# (calibration/measure.py, LONG_CONTEXT): halfway, in tokens, between its short prompts and its long one.
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
    return LiveFigures(rates=rates.at_load(load), exploring=left_to_the_profile(asked) and rates.exploring(load))


@dataclass(frozen=True, kw_only=True)
class HostFigures:
    """What the pair's calibration measured on this worker's host (serving/calibrated.py): the configuration its
    main alone is fastest in, the one its own engine is exact in, and a lone answer's best K (0: the main alone)."""

    host: str  # the host, described
    main_alone_config: str = ""  # a precision configuration's name (serving/precision.py); "": not calibrated
    own_config: str = ""
    best_k: dict[int, int] = field(default_factory=dict)
    draft_stop_below: float | None = None  # the best K was measured with the draft stopping where unsure
    library_alone: dict[int, bool] = field(default_factory=dict)  # {streams: the library's main alone is faster}
    draft_alternative: bool = False  # the own engine loads the pair's draft in its other weight format: cheaper here
    step_costs: tuple[float, ...] = ()  # a draft token, then the verify of 2, 3, ... tokens, as shares of a main token
    batch_k: int = 0  # beyond the pair's speculating streams, answers speculate at this K in the own engine's batch
    long_context_k: int | None = None  # a lone answer's K after LONG_CONTEXT_FROM prompt tokens (0: the main alone)
    long_context_library: bool = False  # and there the library's main alone was faster than the own engine's

    @property
    def calibrated(self) -> bool:
        return bool(self.main_alone_config)

    def k_at(self, load: int) -> int | None:
        return self.best_k.get(load)  # it measures lone answers only: None beyond

    @property
    def alone_on_library(self) -> bool:
        """Whether a burst's main alone runs on the library's pipeline (in its fastest configuration) rather than the
        own engine's batch: where that was faster at the most streams measured, the load where the main alone runs
        most. One engine for a burst: two would split it between two copies of the weights on the same cores."""
        return bool(self.library_alone) and self.library_alone[max(self.library_alone)]

    @property
    def lone_alone_on_library(self) -> bool:
        """Whether a lone answer's main alone runs there too: only where the library was also faster at one stream.
        Else it runs on the own engine, the computation of the main the pair's speculating answers are exact to, so
        that `speculative: false` writes the same text as the default (the two computations part at near-ties:
        docs/exactness.md); a burst then moves it to the library (handover.py)."""
        return self.alone_on_library and self.library_alone.get(1, False)


@dataclass(frozen=True, kw_only=True)
class Plan:
    route: Route
    sampled: bool = False  # the request samples (temperature > 0): the exact rule on the own engine
    k: int | None = None
    threshold: float | None = None
    draft_stop_below: float | None = None  # the own engine's draft holds back a token it is this unsure of
    step_costs: tuple[float, ...] = ()  # the own engine's draft proposes up to K, what the answer's acceptance pays for
    batch_k: int = 0  # the K it speculates at once it runs in the own engine's batch (0: the main alone there)
    why: tuple[Why, ...] = ()
    measured_here: bool = False  # this worker's recent figures show this path clearly faster at the load

    @property
    def mode(self) -> SpeculativeMode:
        """How the answer is served, as the API and the chat state it."""
        if self.route.is_main_alone():
            return SpeculativeMode.OFF
        if self.route == Route.PROMPT_LOOKUP:
            return SpeculativeMode.PROMPT_LOOKUP
        if not self.sampled:
            return SpeculativeMode.DRAFT
        return SpeculativeMode.EXACT_SAMPLING if self.route.is_own_engine() else SpeculativeMode.INEXACT_SAMPLING

    @property
    def reasons(self) -> tuple[Reason, ...]:
        return tuple(why.code for why in self.why)

    @property
    def reason(self) -> str:
        return sentence(self.why)

    @property
    def handed_over(self) -> bool:
        """The answer already moved once: it stays (each move costs a prefill)."""
        return Reason.HANDED_OVER in self.reasons

    def because(self, *whys: Why) -> Plan:
        return replace(self, why=(*self.why, *whys))


def measured_k(*, pair: ModelPair, sampled: bool, load: int) -> tuple[int, int] | None:
    """(best K, at how many streams) from the pair's profile for this load: the entry measured at the
    largest concurrency not above it. 0 means the main alone was fastest there. None: not measured."""
    measured = _profile(pair, sampled=sampled)
    if not measured:
        return None
    at_or_below = [entry for entry in measured if entry[0] <= load]
    streams, k = at_or_below[-1] if at_or_below else measured[0]
    return k, streams


def _profile(pair: ModelPair, *, sampled: bool) -> list[tuple[int, int]]:
    """The pair's measured (streams, best K) entries for greedy or sampled requests, by streams; none if
    the stored profile is invalid (saved around the pair's validation)."""
    if profile_errors(pair.speculation_profile):
        log.warning("pair %s: its speculation profile is invalid, the default K serves", pair.slug)
        return []
    table = (pair.speculation_profile or {}).get("sampled" if sampled else "greedy") or {}
    return sorted((int(streams), int(k)) for streams, k in table.items())


def left_to_the_profile(asked: Asked) -> bool:
    """A greedy request that leaves speculation and K to the pair, held to no grammar: the only kind whose K
    may follow the load (the profile and the live figures are measured without a grammar)."""
    return (asked.speculative and not asked.sampled and not asked.constrained and asked.k is None
            and asked.threshold is None)


# Ks within this fraction of the fastest one's tokens/s are as fast as it (within a burst's run-to-run
# spread: docs/benchmark.md). The smallest of them serves: its steps are shorter, so a request joining the
# batch waits less for its first token.
AS_FAST = 0.97


def quickest_k(rates: dict[int, float]) -> int:
    """The smallest K as fast as the fastest, from {K: tokens/s}."""
    top = max(rates.values())
    return min(k for k, rate in rates.items() if rate >= AS_FAST * top)


# This worker's recent figures decide where one path is this much faster than the other at the load (it repays a
# handover's prefill, beyond a burst's spread). Closer, the request joins the batch that runs, or the main alone.
LIVE_MARGIN = 1.10


def live_k(live: dict[int, float] | None) -> tuple[int | None, dict] | None:
    """(the clearly faster K, 0 for the main alone, or None if neither is; the figures) from {K: tokens/s}
    measured lately at the load, when the main alone (K=0) and a K are in it; of several Ks, quickest_k's."""
    alone = (live or {}).get(0)
    drafted = {k: rate for k, rate in (live or {}).items() if k > 0}
    if not alone or not drafted:
        return None
    k = quickest_k(drafted)
    figures = {"k": k, "k_rate": drafted[k], "alone_rate": alone}
    if drafted[k] >= LIVE_MARGIN * alone:
        return k, figures
    return (0 if alone >= LIVE_MARGIN * drafted[k] else None), figures


def pair_default_route(pair: ModelPair) -> Route:
    """The engine a pair serves as registered, loaded with the pair (ModelPair.own_engine_streams: its own)."""
    return Route.OWN_SPECULATIVE if pair.own_engine_streams else Route.LIBRARY_SPECULATIVE


def plan(*, pair: ModelPair, asked: Asked, load: Load, live: LiveFigures | None = None,
         calibration: HostFigures | None = None) -> Plan:
    """The route, K and reasons of a request joining a worker where `load` runs; `live`: the worker's recent
    figures at that load; `calibration`: what the pair measured on the worker's host (None on the web side).
    First the library's plan (from the request, the figures, else the calibration, else the profile, else the
    pair's defaults), then adjusted to the batch running here, then moved to the pair's own engine where it
    serves; the main alone runs in the configuration the host measured fastest."""
    planned = on_the_library(pair=pair, asked=asked, load=load.streams, live=live, calibration=calibration)
    planned = _join_running_batch(pair=pair, asked=asked, planned=planned, load=load)
    planned = _on_own_engine(pair=pair, asked=asked, planned=planned, load=load.streams)
    if calibration is None:
        return planned
    return _on_the_host(asked=asked, planned=planned, calibration=calibration,
                        lone=load.streams <= pair.own_engine_streams)


def _on_the_host(*, asked: Asked, planned: Plan, calibration: HostFigures, lone: bool) -> Plan:
    """Speculation in the own engine's batch where the host measured it faster than any main alone under load;
    the main alone where the host measured it fastest: on the library's pipeline rather than the own engine's
    batch when that was faster there under load (a second copy of the main's weights, freed when idle), and for
    a `lone` answer (within the pair's own streams) only when it was faster at one stream too."""
    if not calibration.calibrated:
        return planned.because(Why(Reason.NOT_CALIBRATED))
    if calibration.batch_k and planned.route.is_own_engine():
        planned = _in_the_batch(asked=asked, planned=planned, k=calibration.batch_k)
    if (lone and planned.route == Route.OWN_SPECULATIVE and asked.k is None and planned.draft_stop_below is None
            and calibration.step_costs):
        planned = replace(planned, step_costs=calibration.step_costs).because(Why(Reason.K_PER_ANSWER))
    on_library = ((calibration.lone_alone_on_library if lone else calibration.alone_on_library)
                  or (asked.prompt_tokens >= LONG_CONTEXT_FROM and calibration.long_context_library))
    if planned.route == Route.OWN_MAIN_ALONE and not asked.alternatives and on_library:
        own_whys = {Reason.OWN_ENGINE, Reason.OWN_BATCH}
        planned = replace(planned, route=Route.LIBRARY_MAIN_ALONE,
                          why=tuple(why for why in planned.why if why.code not in own_whys))
    if not planned.route.is_main_alone():
        return planned
    config = calibration.own_config if planned.route.is_own_engine() else calibration.main_alone_config
    return planned.because(Why(Reason.FASTEST_CONFIG, {"config": precision.CONFIGS[config].label}))


def _in_the_batch(*, asked: Asked, planned: Plan, k: int) -> Plan:
    """An answer of the own engine speculating at the host's K for its batch once it runs there (engines/own/batch.py):
    from the start where it joins the batch (beyond the pair's speculating streams, where it was planned to run
    there as the main alone), else once more answers come. Not where it asked for the main alone."""
    if planned.route == Route.OWN_MAIN_ALONE and asked.speculative and Reason.OWN_BATCH in planned.reasons:
        why = tuple(why for why in planned.why if why.code != Reason.OWN_BATCH)
        return Plan(route=Route.OWN_SPECULATIVE, sampled=planned.sampled, k=k, batch_k=k,
                    why=(*why, Why(Reason.OWN_BATCH_SPECULATING, {"k": k})))
    return replace(planned, batch_k=k) if planned.route == Route.OWN_SPECULATIVE else planned


def on_the_library(*, pair: ModelPair, asked: Asked, load: int, live: LiveFigures | None,
                    calibration: HostFigures | None = None) -> Plan:
    """The plan on openvino-genai's pipelines (or the own engine for exact sampling). A greedy answer with a
    draft on a pair in the fast mode says so (FAST_MODE)."""
    planned = _by_the_request(pair=pair, asked=asked, load=load, live=live, calibration=calibration)
    if planned.mode == SpeculativeMode.DRAFT and pair.precision_mode == ModelPair.FAST:
        return planned.because(Why(Reason.FAST_MODE))
    return planned


def _by_the_request(*, pair: ModelPair, asked: Asked, load: int, live: LiveFigures | None,
                    calibration: HostFigures | None) -> Plan:
    if not asked.speculative:
        return Plan(route=Route.LIBRARY_MAIN_ALONE, sampled=asked.sampled, why=(Why(Reason.ASKED_OFF),))
    if not pair.is_speculative:
        return Plan(route=Route.LIBRARY_MAIN_ALONE, sampled=asked.sampled, why=(Why(Reason.NO_DRAFT),))
    named = asked.k is not None or asked.threshold is not None
    if asked.constrained and not named and not asked.sampled:
        return Plan(route=Route.LIBRARY_MAIN_ALONE, why=(Why(Reason.CONSTRAINED),))
    if not pair.draft_dir:  # prompt lookup samples from the main and compares with the n-gram: exact
        return Plan(route=Route.PROMPT_LOOKUP, sampled=asked.sampled,
                    k=asked.k or pair.num_assistant_tokens or DEFAULT_K,
                    why=(Why(Reason.K_ASKED if asked.k else Reason.PROMPT_LOOKUP),))
    exact = asked.sampled and not pair.allow_inexact_sampling  # under a grammar too: it masks both models
    drafting = Plan(route=Route.OWN_SPECULATIVE if exact else Route.LIBRARY_SPECULATIVE, sampled=asked.sampled,
                    why=(Why(Reason.INEXACT_ALLOWED),) if asked.sampled and not exact else ())
    if exact and asked.threshold is not None:
        return replace(drafting, k=pair.num_assistant_tokens or DEFAULT_K).because(Why(Reason.EXACT_THRESHOLD))
    if asked.threshold is not None:
        return replace(drafting, threshold=asked.threshold).because(Why(Reason.THRESHOLD_ASKED))
    if asked.k is not None:
        return replace(drafting, k=asked.k).because(Why(Reason.K_ASKED))
    return _for_the_load(pair=pair, asked=asked, drafting=drafting, load=load, live=live, calibration=calibration)


def _for_the_load(*, pair: ModelPair, asked: Asked, drafting: Plan, load: int, live: LiveFigures | None,
                  calibration: HostFigures | None) -> Plan:
    """The plan of a request that leaves K to the pair: from the figures here, else the host's calibration
    (measured on the own engine: for a pair whose own engine serves lone answers), else the profile, else the
    pair's default. `drafting`: the route it drafts on, and why that route."""
    alone = Plan(route=Route.LIBRARY_MAIN_ALONE, sampled=asked.sampled)
    here = None if asked.sampled or live is None else live_k(live.rates)  # the own engine's steps are not measured
    if here is not None:
        k, figures = here
        facts = {"load": load, **figures}
        if k is None:
            return alone.because(Why(Reason.LIVE_NEITHER_FASTER, facts))
        if k == 0:
            return replace(alone, measured_here=True).because(Why(Reason.LIVE_MAIN_ALONE_FASTER, facts))
        return replace(drafting, k=k, measured_here=True).because(Why(Reason.LIVE_K_FASTEST, facts))
    if live is not None and live.exploring and live.rates and drafting.mode == SpeculativeMode.DRAFT:
        return _explore(pair=pair, live=live.rates, load=load)
    calibrated = calibration.k_at(load) if calibration and pair.own_engine_streams and not asked.sampled else None
    if calibrated and calibration and asked.prompt_tokens >= LONG_CONTEXT_FROM and calibration.long_context_k == 0:
        return alone.because(Why(Reason.CALIBRATED_LONG_CONTEXT_ALONE, {"tokens": LONG_CONTEXT_FROM}))
    if calibrated == 0:
        return alone.because(Why(Reason.CALIBRATED_MAIN_ALONE_FASTER))
    if calibrated:
        stop = calibration.draft_stop_below if calibration else None
        return replace(drafting, k=calibrated, draft_stop_below=stop).because(
            Why(Reason.CALIBRATED_BEST_K_STOPPED, {"k": calibrated, "stop": stop}) if stop is not None
            else Why(Reason.CALIBRATED_BEST_K, {"k": calibrated}))
    best = measured_k(pair=pair, sampled=asked.sampled, load=load)
    if best is None:
        if (pair.num_assistant_tokens is None and pair.assistant_confidence_threshold is not None
                and drafting.mode != SpeculativeMode.EXACT_SAMPLING):
            return replace(drafting, threshold=pair.assistant_confidence_threshold).because(
                Why(Reason.PAIR_DEFAULT_THRESHOLD))
        invalid = profile_errors(pair.speculation_profile)
        return replace(drafting, k=pair.num_assistant_tokens or DEFAULT_K).because(
            Why(Reason.PAIR_DEFAULT_K_INVALID_PROFILE if invalid else Reason.PAIR_DEFAULT_K))
    k, streams = best
    if k == 0:
        return alone.because(Why(Reason.PROFILE_MAIN_ALONE_FASTER, {"streams": streams, "load": load}))
    return replace(drafting, k=k).because(Why(Reason.PROFILE_BEST_K, {"streams": streams, "load": load}))


def _explore(*, pair: ModelPair, live: dict[int, float], load: int) -> Plan:
    """The path this worker has no figure for at the load, tried as if it were clearly faster: requests
    joining go to it, and once the other path's answers have ended its steps run alone and count."""
    if 0 not in live:
        return Plan(route=Route.LIBRARY_MAIN_ALONE, measured_here=True,
                    why=(Why(Reason.EXPLORING_MAIN_ALONE, {"load": load}),))
    best = measured_k(pair=pair, sampled=False, load=load)
    k = (best[0] if best and best[0] else None) or _highest_load_k(pair) or DEFAULT_K
    return Plan(route=Route.LIBRARY_SPECULATIVE, k=k, measured_here=True,
                why=(Why(Reason.EXPLORING_SPECULATION, {"load": load}),))


def _join_running_batch(*, pair: ModelPair, asked: Asked, planned: Plan, load: Load) -> Plan:
    """The plan adjusted to the batch already running here. A pair's speculative pipeline and its main
    alone are two step processes on the same cores: run together they contend, slower than either alone
    (docs/benchmark-log.md, "Under load"). So a greedy request the
    profile plans joins whichever of the two is running, when only one is: with the main alone's batch
    it takes K=0 (and is handed over when that batch empties), with the speculative batch the K the
    profile chose at its highest load where speculation won. A plan from this worker's own recent
    figures stands: the other path's answers end there (or move, in a batch of 2 or fewer: handover)."""
    if not left_to_the_profile(asked) or planned.measured_here:
        return planned
    speculative, alone = load.running_speculative, load.running_alone
    if planned.route == Route.LIBRARY_MAIN_ALONE and speculative and not alone:
        k = _highest_load_k(pair)
        if k:
            return replace(planned, route=Route.LIBRARY_SPECULATIVE, k=k).because(
                Why(Reason.JOINS_SPECULATIVE_BATCH, {"k": k}))
    if planned.route == Route.LIBRARY_SPECULATIVE and alone and not speculative:
        return Plan(route=Route.LIBRARY_MAIN_ALONE, why=(*planned.why, Why(Reason.JOINS_MAIN_ALONE_BATCH)))
    return planned


def _highest_load_k(pair: ModelPair) -> int | None:
    winning = [(streams, k) for streams, k in _profile(pair, sampled=False) if k > 0]
    return winning[-1][1] if winning else pair.num_assistant_tokens


def _on_own_engine(*, pair: ModelPair, asked: Asked, planned: Plan, load: int) -> Plan:
    """The plan moved to the pair's own engine (ModelPair.own_engine_streams): while the pair runs at most that
    many answers here, this one included, it speculates there (greedy, sampled or the main alone, under a
    grammar or not, exact with dynamic quantization); beyond that the main alone serves there, in one batch
    (engines/own/batch.py), a K the request named included: the library's pipeline, which batches speculation, runs
    the main in another precision than the main alone's (its answers parted from it on the Intel host) and ran
    0.4-0.6x the batch there. One copy of the weights either way. Not for a
    confidence threshold, which only the library applies. A request asking alternatives (top_logprobs) runs on
    the own engine at any load."""
    if asked.alternatives:
        return _for_alternatives(pair=pair, planned=planned)
    if not pair.own_engine_streams or planned.threshold is not None:
        return planned
    if planned.mode not in (SpeculativeMode.DRAFT, SpeculativeMode.OFF, SpeculativeMode.EXACT_SAMPLING):
        return planned
    if load > pair.own_engine_streams:
        beyond = Why(Reason.BEYOND_OWN_STREAMS, {"load": load})
        if not asked.speculative:
            busy = planned.why
        elif asked.k is not None:  # the K it named, set aside, and said
            busy = (*planned.why, beyond)
        else:
            busy = (beyond,)
        return Plan(route=Route.OWN_MAIN_ALONE, sampled=asked.sampled, why=(*busy, Why(Reason.OWN_BATCH)))
    if Reason.CONSTRAINED in planned.reasons:
        return Plan(route=Route.OWN_SPECULATIVE, k=pair.num_assistant_tokens or DEFAULT_K,
                    why=(Why(Reason.OWN_CONSTRAINED), Why(Reason.OWN_ENGINE)))
    own = Route.OWN_MAIN_ALONE if planned.route.is_main_alone() else Route.OWN_SPECULATIVE
    return replace(planned, route=own).because(Why(Reason.OWN_ENGINE))


def _for_alternatives(*, pair: ModelPair, planned: Plan) -> Plan:
    """A request asking top_logprobs runs on the own engine at any load (the API refuses it for a pair
    without a draft, or with a confidence threshold): greedy, sampled exactly, or the main alone (K=0)."""
    if planned.route.is_main_alone():
        own, k = Route.OWN_MAIN_ALONE, None
    else:
        own, k = Route.OWN_SPECULATIVE, planned.k or pair.num_assistant_tokens or DEFAULT_K
    why = tuple(why for why in planned.why if why.code != Reason.INEXACT_ALLOWED)  # exact on the own engine
    return Plan(route=own, sampled=planned.sampled, k=k, why=(*why, Why(Reason.ALTERNATIVES)))
