"""Where an answer runs: `RULES`, one ordered table; the first rule that answers makes the whole plan (route, K, its
K in the own engine's batch, every reason code), and no rule edits another's. Each rule reads the `Situation` and the
`Choice` (choice.py: whether it speculates, at which K, and why); `_served` adds what the host's calibration says of
the route it chose (the precision of a main alone, a K per answer, a batch's K).

docs/speculation.md shows this table, checked by tests/unit/serving/test_planning.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from inference.limits import Route
from inference.models import ModelPair
from inference.serving import precision
from inference.serving.planning.choice import choose, pair_k
from inference.serving.planning.decision import Choice, Plan
from inference.serving.planning.inputs import Load, Situation
from inference.serving.reasons import Reason, Why


def _fast_mode(s: Situation) -> tuple[Why, ...]:
    """A greedy answer with the draft on a pair in the fast mode may part from the main alone at near-ties."""
    return (Why(Reason.FAST_MODE),) if s.pair.precision_mode == ModelPair.FAST and not s.asked.sampled else ()


def _served(s: Situation, route: Route, *, why: tuple[Why, ...], k: int | None = None,
            threshold: float | None = None, draft_stop_below: float | None = None, batch_k: int | None = None,
            lookup_only: bool = False, measured_here: bool = False) -> Plan:
    """The plan of a route, and what the host's calibration adds to it: a K per answer (a lone answer at a K it did not
    name, where the host's step costs were timed), the configuration a main alone is fastest in; or that the host is
    not calibrated yet."""
    host = s.host
    step_costs: tuple[float, ...] = ()
    adds: tuple[Why, ...] = ()
    if host is not None and not host.calibrated:
        adds = (Why(Reason.NOT_CALIBRATED),)
    elif host is not None and route == Route.OWN_SPECULATIVE:
        # after a long prompt, the costs the calibration timed after its long one (a verify weighs otherwise there)
        costs = host.long_step_costs if s.long_prompt and host.long_step_costs else host.step_costs
        if s.lone and s.asked.k is None and draft_stop_below is None and not lookup_only and costs:
            step_costs, adds = costs, (Why(Reason.K_PER_ANSWER),)
    elif host is not None and route.is_main_alone():
        config = host.own_config if route.is_own_engine() else host.main_alone_config
        adds = (Why(Reason.FASTEST_CONFIG, {"config": precision.CONFIGS[config].label}),)
    return Plan(route=route, sampled=s.asked.sampled, k=k, threshold=threshold, draft_stop_below=draft_stop_below,
                step_costs=step_costs, batch_k=batch_k if route == Route.OWN_SPECULATIVE else None,
                lookup_only=lookup_only, why=(*why, *adds), measured_here=measured_here)


def top_logprobs(s: Situation, choice: Choice) -> Plan | None:
    """Alternatives only the own engine computes: there at any load, speculating or its main alone."""
    if not s.asked.alternatives:
        return None
    if choice.alone:
        return _served(s, Route.OWN_MAIN_ALONE, why=(*choice.why, Why(Reason.ALTERNATIVES)))
    return _served(s, Route.OWN_SPECULATIVE, k=choice.k or pair_k(s.pair), batch_k=choice.batch_k,
                   why=(*choice.why, *_fast_mode(s), Why(Reason.ALTERNATIVES)))


def prompt_lookup(s: Situation, choice: Choice) -> Plan | None:
    """A pair without a draft model drafts from the prompt on the library's pipeline."""
    if s.pair.draft_dir or choice.alone:
        return None
    return _served(s, Route.PROMPT_LOOKUP, k=choice.k, why=choice.why)


def library_threshold(s: Situation, choice: Choice) -> Plan | None:
    """A confidence threshold, which only the library's pipeline applies."""
    if choice.threshold is None:
        return None
    inexact = (Why(Reason.INEXACT_ALLOWED),) if s.asked.sampled else ()
    return _served(s, Route.LIBRARY_SPECULATIVE, threshold=choice.threshold,
                   why=(*inexact, *choice.why, *_fast_mode(s)))


def inexact_sampling(s: Situation, choice: Choice) -> Plan | None:
    """A sampled answer on a pair that allows the library's sampling with a draft (and says so)."""
    if not s.asked.sampled or s.exact or choice.alone:
        return None
    return _served(s, Route.LIBRARY_SPECULATIVE, k=choice.k, why=(Why(Reason.INEXACT_ALLOWED), *choice.why))


def own_batch(s: Situation, choice: Choice) -> Plan | None:
    """Beyond the answers the pair speculates for, its own engine's batch, one copy of the weights, as the choice
    says (choice.py's `in_own_batch`, or the K the request named); its main alone there is the same computation as
    speculation's (engines/own/kv_cache.py), so the same answer."""
    if not s.beyond_own_streams:
        return None
    if choice.alone:
        return _until_alone(s, _served(s, Route.OWN_MAIN_ALONE, why=(*choice.why, Why(Reason.OWN_BATCH))))
    why = choice.why
    if s.asked.k is not None:
        why = (*why, Why(Reason.BEYOND_OWN_STREAMS, {"load": s.streams}),
               Why(Reason.OWN_BATCH_K_ASKED, {"k": s.asked.k}))
    return _served(s, Route.OWN_SPECULATIVE, k=choice.k, batch_k=choice.batch_k, why=why)


# What a lone answer's plan says of how it speculates beyond its K (the engine is handed it: engines/decoding.py)
HOW_A_LONE_ANSWER_SPECULATES = (Reason.K_PER_ANSWER, Reason.CALIBRATED_LONG_CONTEXT_LOOKUP,
                                Reason.CALIBRATED_BEST_K_STOPPED)


def _until_alone(s: Situation, batched: Plan) -> Plan:
    """An answer that starts in the own engine's batch as the main alone speculates once the other answers have
    ended, at the K a lone answer gets (its steps are the main alone's until then: engines/own/engine.py,
    `_join_batch_if_busy`, `_leave_batch_once_alone`); where a lone answer would run the main alone too, it does."""
    if s.asked.constrained:  # it would not leave the batch (the draft would have to replay the grammar's state)
        return batched
    lone = plan_for(replace(s, load=Load(streams=s.pair.own_engine_streams), live=None))
    if lone.route != Route.OWN_SPECULATIVE or not lone.k:
        return batched
    how = [why for why in lone.why if why.code in HOW_A_LONE_ANSWER_SPECULATES]
    return replace(lone, batch_k=None, why=(*batched.why, Why(Reason.OWN_BATCH_UNTIL_ALONE, {"k": lone.k}), *how))


def own_engine(s: Situation, choice: Choice) -> Plan | None:
    """Within the answers the pair speculates for, its own engine: speculating, or its main alone on the same kernels,
    so that switching speculation off never changes a greedy answer."""
    if not s.lone:
        return None
    if not choice.alone:
        return _served(s, Route.OWN_SPECULATIVE, k=choice.k, draft_stop_below=choice.draft_stop_below,
                       batch_k=choice.batch_k, lookup_only=choice.lookup_only, measured_here=choice.measured_here,
                       why=(*choice.why, *_fast_mode(s), Why(Reason.OWN_ENGINE)))
    return _served(s, Route.OWN_MAIN_ALONE, why=(*choice.why, Why(Reason.OWN_ENGINE)),
                   measured_here=choice.measured_here)


def exact_sampling(s: Situation, choice: Choice) -> Plan | None:
    """A sampled answer speculates on the own engine, drawn from the main's distribution (the library's sampling
    with a draft is not)."""
    if not s.exact or choice.alone:
        return None
    return _served(s, Route.OWN_SPECULATIVE, k=choice.k, batch_k=choice.batch_k, why=choice.why)


def library_speculation(s: Situation, choice: Choice) -> Plan | None:
    if choice.alone:
        return None
    return _served(s, Route.LIBRARY_SPECULATIVE, k=choice.k, draft_stop_below=choice.draft_stop_below,
                   measured_here=choice.measured_here, why=(*choice.why, *_fast_mode(s)))


def library_main_alone(s: Situation, choice: Choice) -> Plan:
    return _served(s, Route.LIBRARY_MAIN_ALONE, why=choice.why, measured_here=choice.measured_here)


RULES: tuple[Callable[[Situation, Choice], Plan | None], ...] = (
    top_logprobs, prompt_lookup, library_threshold, inexact_sampling, own_batch, own_engine,
    exact_sampling, library_speculation, library_main_alone,
)


def plan_for(s: Situation) -> Plan:
    """The first of RULES that answers."""
    choice = choose(s)
    for rule in RULES:
        planned = rule(s, choice)
        if planned is not None:
            return planned
    raise AssertionError("library_main_alone always answers")
