"""How a request is served — which engine, which K, and why — decided when it joins a worker's batch,
from what it asked, the pair's settings and measured profile, and the worker's load then.

Both sides use it: the web side to validate a request with the settings it would get, the worker to
decide for real (it knows its load). Two promises shape it: a sampled request runs on the exact engine
(engines/exact.py), never on openvino-genai's inexact sampling with a draft unless the pair allows it
(and then says so); and where the main alone is faster at the current load, the main alone serves
(speculation must never slow answers). Faster by what this worker measured lately at that load
(engines/rates.py) where it measured both the main alone and a K there, else by the pair's profile;
where it measured only one of them at a load of 4 or more streams, it tries the other now and then.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from inference.limits import DEFAULT_K, SpeculativeMode
from inference.models import ModelPair
from inference.pair_checks import profile_errors

log = logging.getLogger(__name__)
EXACT_THRESHOLD = "the confidence threshold applies to greedy requests; exact sampling takes K"
# Under a grammar the library masks every position the main scores, the draft's proposals included, and on
# the pair measured the masks cost more than speculation saved (docs/exactness.md#under-a-grammar). So a
# request under one speculates only when it names its K (or threshold).
CONSTRAINED = "held to a grammar, where speculation measured slower than the main alone; name a K to speculate"
INEXACT_ALLOWED = "allowed by the pair: answers are not drawn from the main model's distribution"
# The device's default precision quantizes activations differently for one token and for K+1 verified at once.
FAST_MODE = "fast mode: tokens may differ from the main alone's where two are near-tied"


@dataclass(frozen=True, kw_only=True)
class Asked:
    """What the request asked for about speculation (None: the pair decides)."""

    speculative: bool = True
    k: int | None = None
    threshold: float | None = None
    sampled: bool = False
    constrained: bool = False  # the output is held to a grammar (response_format, regex, grammar)
    alternatives: bool = False  # top_logprobs: each position's most likely tokens, which only our exact engine gives


@dataclass(frozen=True, kw_only=True)
class Plan:
    mode: SpeculativeMode
    reason: str = ""
    k: int | None = None
    threshold: float | None = None
    measured_here: bool = False  # this worker's recent figures show this path clearly faster at the load
    handed_over: bool = False  # the answer already moved once: it stays (each move costs a prefill)
    own_engine: bool = False  # on the pair's own engine (on_own_engine), whatever the mode: it stays there

    @property
    def speculative(self) -> bool:
        return self.mode != SpeculativeMode.OFF

    @property
    def exact_sampling(self) -> bool:
        return self.mode == SpeculativeMode.EXACT_SAMPLING


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


# Ks within this fraction of the fastest one's tokens/s are as fast as it (one burst of the benchmark
# varies by 5-10% here). The smallest of them serves: its steps are shorter, so a request joining the
# batch waits less for its first token.
AS_FAST = 0.97


def quickest_k(rates: dict[int, float]) -> int:
    """The smallest K as fast as the fastest, from {K: tokens/s}."""
    top = max(rates.values())
    return min(k for k, rate in rates.items() if rate >= AS_FAST * top)


# This worker's recent figures decide where one path is this much faster than the other at the load
# (it repays a handover's prefill; one burst of the benchmark varies by 5-10% here). Closer than that,
# the two are as good as each other: the request joins the batch that runs, or the main alone.
LIVE_MARGIN = 1.10


def live_k(live: dict[int, float] | None) -> tuple[int | None, str] | None:
    """(the clearly faster K, 0 for the main alone, or None if neither is; the figures) from {K: tokens/s}
    measured lately at the load, when the main alone (K=0) and a K are in it; of several Ks, quickest_k's."""
    alone = (live or {}).get(0)
    drafted = {k: rate for k, rate in (live or {}).items() if k > 0}
    if not alone or not drafted:
        return None
    k = quickest_k(drafted)
    figures = f"K={k} {drafted[k]:.0f} tok/s, the main alone {alone:.0f} tok/s"
    if drafted[k] >= LIVE_MARGIN * alone:
        return k, figures
    return (0 if alone >= LIVE_MARGIN * drafted[k] else None), figures


def plan(*, pair: ModelPair, asked: Asked, load: int, live: dict[int, float] | None = None,
         exploring: bool = False) -> Plan:
    """The plan for a request joining a worker that already runs `load - 1` of the pair's requests;
    `live` is what the worker's engines delivered lately at that load, {K: tokens/s} (0: the main alone);
    `exploring`: the worker tries the path it has no figure for at this load (StepRates.exploring).
    A greedy answer with a draft on a pair in the fast mode says so (FAST_MODE)."""
    planned = _plan(pair=pair, asked=asked, load=load, live=live, exploring=exploring)
    if planned.mode == SpeculativeMode.DRAFT and pair.precision_mode == ModelPair.FAST:
        return replace(planned, reason=_join(planned.reason, FAST_MODE))
    return planned


def _plan(*, pair: ModelPair, asked: Asked, load: int, live: dict[int, float] | None,
          exploring: bool) -> Plan:
    if not asked.speculative:
        return Plan(mode=SpeculativeMode.OFF, reason="speculative: false was asked")
    if not pair.is_speculative:
        return Plan(mode=SpeculativeMode.OFF, reason="the pair has no draft model")
    named = asked.k is not None or asked.threshold is not None
    if asked.constrained and not named and not asked.sampled:
        return Plan(mode=SpeculativeMode.OFF, reason=CONSTRAINED)
    if not pair.draft_dir:  # prompt lookup samples from the main and compares with the n-gram: exact
        return Plan(mode=SpeculativeMode.PROMPT_LOOKUP, k=asked.k or pair.num_assistant_tokens or DEFAULT_K)
    exact = asked.sampled and not pair.allow_inexact_sampling  # under a grammar too: it masks both models
    if asked.sampled:
        mode = SpeculativeMode.EXACT_SAMPLING if exact else SpeculativeMode.INEXACT_SAMPLING
    else:
        mode = SpeculativeMode.DRAFT
    allowed = INEXACT_ALLOWED if asked.sampled and not exact else ""
    if exact and asked.threshold is not None:
        return Plan(mode=mode, k=pair.num_assistant_tokens or DEFAULT_K, reason=EXACT_THRESHOLD)
    if asked.threshold is not None:
        return Plan(mode=mode, threshold=asked.threshold, reason=_join(allowed, "confidence threshold asked"))
    if asked.k is not None:
        return Plan(mode=mode, k=asked.k, reason=_join(allowed, "K asked by the request"))
    return _for_the_load(pair=pair, asked=asked, mode=mode, load=load, live=live, exploring=exploring)


def _for_the_load(*, pair: ModelPair, asked: Asked, mode: SpeculativeMode, load: int,
                  live: dict[int, float] | None, exploring: bool) -> Plan:
    """The plan of a request that leaves K to the pair: from the figures here, else the profile, else the
    pair's default."""
    exact = mode == SpeculativeMode.EXACT_SAMPLING
    allowed = INEXACT_ALLOWED if mode == SpeculativeMode.INEXACT_SAMPLING else ""
    here = None if asked.sampled else live_k(live)  # the exact engine's steps are not measured
    if here is not None:
        k, figures = here
        where = f"measured here lately at {load} streams: {figures}"
        if k is None:
            return Plan(mode=SpeculativeMode.OFF, reason=f"neither is clearly faster ({where})")
        if k == 0:
            return Plan(mode=SpeculativeMode.OFF, reason=f"the main alone is faster ({where})", measured_here=True)
        return Plan(mode=mode, k=k, reason=f"K={k} is fastest ({where})", measured_here=True)
    if exploring and live and mode == SpeculativeMode.DRAFT:
        return _explore(pair=pair, live=live, load=load)
    best = measured_k(pair=pair, sampled=asked.sampled, load=load)
    if best is None:
        if pair.num_assistant_tokens is None and pair.assistant_confidence_threshold is not None and not exact:
            return Plan(mode=mode, threshold=pair.assistant_confidence_threshold,
                        reason=_join(allowed, "the pair's default threshold"))
        invalid = profile_errors(pair.speculation_profile)
        why = "its speculation profile is invalid" if invalid else "no measured profile"
        return Plan(mode=mode, k=pair.num_assistant_tokens or DEFAULT_K,
                    reason=_join(allowed, f"the pair's default K ({why})"))
    k, streams = best
    if k == 0:
        return Plan(mode=SpeculativeMode.OFF, reason=f"the main alone is faster at {streams}+ streams (measured); "
                                                     f"{load} running here")
    return Plan(mode=mode, k=k, reason=_join(allowed, f"best K at {streams}+ streams (measured); {load} running here"))


def _explore(*, pair: ModelPair, live: dict[int, float], load: int) -> Plan:
    """The path this worker has no figure for at the load, tried as if it were clearly faster: requests
    joining go to it, and once the other path's answers have ended its steps run alone and count."""
    if 0 not in live:
        return Plan(mode=SpeculativeMode.OFF, measured_here=True,
                    reason=f"exploring: the main alone is not measured here lately at {load} streams")
    best = measured_k(pair=pair, sampled=False, load=load)
    k = (best[0] if best and best[0] else None) or _highest_load_k(pair) or DEFAULT_K
    return Plan(mode=SpeculativeMode.DRAFT, k=k, measured_here=True,
                reason=f"exploring: speculation is not measured here lately at {load} streams")


OWN_ENGINE = "on SpecChat's own engine (few enough of the pair's answers here)"
OWN_BATCH = "the main alone, batched on SpecChat's own engine (more of the pair's answers here than it speculates for)"
ALTERNATIVES = "top_logprobs asked: only SpecChat's exact engine computes alternatives"
# Measured on the real pair under a JSON schema: acceptance 0.81 with the draft masked, against 0.52 on the
# library's pipeline where it is not (docs/benchmark.md#real-pair).
OWN_CONSTRAINED = "held to a grammar, which the own engine applies to the draft too: the pair's K"


def on_own_engine(*, pair: ModelPair, asked: Asked, planned: Plan, load: int) -> Plan:
    """The plan moved to the pair's own engine (ModelPair.own_engine_streams): while the pair runs at most that
    many answers here, this one included, it speculates there (greedy, sampled or the main alone, under a
    grammar or not, exact with dynamic quantization); beyond that the main alone serves there, in one batch
    (engines/batch.py), unless the request named its K. One copy of the weights either way. Not for a
    confidence threshold, which only the library applies. A request asking alternatives (top_logprobs) runs on
    the exact engine at any load."""
    if asked.alternatives:
        return _for_alternatives(pair=pair, planned=planned)
    if not pair.own_engine_streams or planned.threshold is not None:
        return planned
    if planned.mode not in (SpeculativeMode.DRAFT, SpeculativeMode.OFF, SpeculativeMode.EXACT_SAMPLING):
        return planned
    if load > pair.own_engine_streams:
        if asked.k is not None and planned.speculative:
            return planned  # the K it named, on the library's pipelines, which batch speculation
        reason = planned.reason if not asked.speculative else f"{load} of the pair's answers running here"
        return Plan(mode=SpeculativeMode.OFF, own_engine=True, reason=_join(reason, OWN_BATCH))
    if planned.reason == CONSTRAINED:
        return Plan(mode=SpeculativeMode.DRAFT, k=pair.num_assistant_tokens or DEFAULT_K, own_engine=True,
                    reason=_join(OWN_CONSTRAINED, OWN_ENGINE))
    return replace(planned, own_engine=True, reason=_join(planned.reason, OWN_ENGINE))


def _for_alternatives(*, pair: ModelPair, planned: Plan) -> Plan:
    """A request asking top_logprobs runs on the exact engine at any load (the API refuses it for a pair
    without a draft, or with a confidence threshold): greedy, sampled exactly, or the main alone (K=0)."""
    mode = SpeculativeMode.EXACT_SAMPLING if planned.mode == SpeculativeMode.INEXACT_SAMPLING else planned.mode
    k = (planned.k or pair.num_assistant_tokens or DEFAULT_K) if mode != SpeculativeMode.OFF else None
    reason = planned.reason.replace(INEXACT_ALLOWED, "").strip("; ")
    return Plan(mode=mode, k=k, own_engine=True, reason=_join(reason, ALTERNATIVES))


def join_running_batch(*, pair: ModelPair, asked: Asked, planned: Plan, running_speculative: int,
                       running_alone: int) -> Plan:
    """The plan adjusted to the batch already running here. A pair's speculative pipeline and its main
    alone are two step processes on the same cores: run together they contend (a burst of 16 with one
    request on the main alone beside 15 at K=5 measured 0.80x of either alone). So a greedy request the
    profile plans joins whichever of the two is running, when only one is: with the main alone's batch
    it takes K=0 (and is handed over when that batch empties), with the speculative batch the K the
    profile chose at its highest load where speculation won. A plan from this worker's own recent
    figures stands: the other path's answers end there (or move, in a batch of 2 or fewer: handover)."""
    if not left_to_the_profile(asked) or planned.measured_here:
        return planned
    if planned.mode == SpeculativeMode.OFF and running_speculative and not running_alone:
        k = _highest_load_k(pair)
        if k:
            return Plan(mode=SpeculativeMode.DRAFT, k=k, reason=f"{planned.reason}; joins the running "
                                                                f"speculative batch with K={k} (its highest-load K)")
    if planned.mode == SpeculativeMode.DRAFT and running_alone and not running_speculative:
        return Plan(mode=SpeculativeMode.OFF, reason=f"{planned.reason}; joins the running batch of the main alone")
    return planned


def _highest_load_k(pair: ModelPair) -> int | None:
    winning = [(streams, k) for streams, k in _profile(pair, sampled=False) if k > 0]
    return winning[-1][1] if winning else pair.num_assistant_tokens


# A running answer moves to the other pipeline only while the pair's batch here is this small: it must
# prefill its prompt and answer so far again, and that prefill stalls every stream of the batch it joins.
# At 8 streams, answers moved by the figures cost the requests arriving meanwhile 2.6-3.3 s of time to
# first token (against 0.7 s for a fixed K=5): each saved its own stream ~10% of what was left. By the
# profile an answer moves from the main alone to speculation (a burst's last request otherwise ends
# alone at the main's 1-stream speed); by this worker's recent figures, either way.
HANDOVER_MAX_STREAMS = 2
HANDOVER_MIN_TOKENS = 32  # tokens still to generate: fewer would not repay the prefill
HANDED_OVER = "handed over to"  # in the reason of an answer that moved (the benchmark reads it)


def handover(*, pair: ModelPair, asked: Asked, planned: Plan, load: int, generated: int, remaining: int,
             live: dict[int, float] | None = None, exploring: bool = False) -> Plan | None:
    """The plan a running answer moves to, or None to stay: once, between the main alone and speculation,
    for greedy answers the profile or the figures planned, and off the exact engine for sampled ones (the
    library cannot change a request's K, so moving is a new request that goes on from the answer so far;
    its greedy tokens are the same, and sampled ones are drawn from the main's distribution either way)."""
    if remaining < HANDOVER_MIN_TOKENS or planned.handed_over or planned.own_engine:
        return None
    if planned.exact_sampling:
        return _off_the_exact_engine(pair=pair, asked=asked, planned=planned, load=load, generated=generated)
    if planned.mode not in (SpeculativeMode.OFF, SpeculativeMode.DRAFT) or not left_to_the_profile(asked):
        return None
    now = plan(pair=pair, asked=asked, load=load, live=live, exploring=exploring)
    if now.mode == planned.mode or (now.mode == SpeculativeMode.DRAFT and now.k is None):
        return None
    if load > HANDOVER_MAX_STREAMS or (now.mode == SpeculativeMode.OFF and not now.measured_here):
        return None
    to = f"K={now.k}" if now.speculative else "the main alone"
    return Plan(mode=now.mode, k=now.k, measured_here=now.measured_here, handed_over=True,
                reason=f"{planned.reason}; {HANDED_OVER} {to} from token {generated + 1}, {load} running here "
                       f"({now.reason})")


def _off_the_exact_engine(*, pair: ModelPair, asked: Asked, planned: Plan, load: int, generated: int) -> Plan | None:
    """A sampled answer the profile sent to the exact engine goes on with the main alone as soon as the
    profile says the main alone at the load, whatever the load: the exact engine runs each request on its
    own, beside the main alone's batch on the same cores (a burst's first request, planned for one stream,
    held it while the other 7 ran on the main alone: the burst ran at 0.71x the main alone's speed)."""
    if not asked.speculative or asked.k is not None or asked.threshold is not None:
        return None  # the request asked for this engine
    now = plan(pair=pair, asked=asked, load=load)
    if now.mode != SpeculativeMode.OFF:
        return None
    return Plan(mode=now.mode, handed_over=True,
                reason=f"{planned.reason}; {HANDED_OVER} the main alone from token {generated + 1}, {load} running "
                       f"here ({now.reason})")


def _join(*parts: str) -> str:
    return "; ".join(part for part in parts if part)
