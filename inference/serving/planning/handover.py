"""A running answer moved to another engine of its pair when the load changes: once, between the main alone and
speculation on the library's pipelines, off the own engine for sampled answers the profile sent there, and off a
pair's own engine onto the library's main alone when a burst comes where the host measured that faster. A pure
function of the plan it runs on, the request, the load and the worker's figures, like `plan`."""

from __future__ import annotations

from dataclasses import replace

from inference.limits import SpeculativeMode
from inference.models import ModelPair
from inference.serving.planning import Asked, LiveFigures, Load, Plan, plan
from inference.serving.reasons import Reason, Why

# A running answer moves to the other pipeline only while the pair's batch here is this small: it must
# prefill its prompt and answer so far again, and that prefill stalls every stream of the batch it joins
# (docs/speculation.md, "Live figures"). By the profile an answer moves from the main alone to
# speculation (a burst's last request otherwise ends alone at the main's 1-stream speed); by this worker's
# recent figures, either way.
HANDOVER_MAX_STREAMS = 2
HANDOVER_MIN_TOKENS = 32  # tokens still to generate: fewer would not repay the prefill


def handover(*, pair: ModelPair, asked: Asked, planned: Plan, load: int, generated: int, remaining: int,
             live: LiveFigures | None = None) -> Plan | None:
    """The plan a running answer moves to, or None to stay: once, between the main alone and speculation,
    for greedy answers the profile or the figures planned, and off the own engine for sampled ones (the
    library cannot change a request's K, so moving is a new request that goes on from the answer so far;
    its greedy tokens are the same, and sampled ones are drawn from the main's distribution either way).
    An answer the pair's own engine serves stays there: its main alone runs on it too."""
    if remaining < HANDOVER_MIN_TOKENS or planned.handed_over:
        return None
    if pair.own_engine_streams:
        return None
    if planned.route.is_own_engine():
        if asked.alternatives:
            return None
        return _off_the_own_engine(pair=pair, asked=asked, planned=planned, load=load, generated=generated)
    if planned.mode not in (SpeculativeMode.OFF, SpeculativeMode.DRAFT) or not asked.left_to_the_pair:
        return None
    now = plan(pair=pair, asked=asked, load=Load(streams=load), live=live)
    if now.route == planned.route or (now.route.speculates() and now.k is None):
        return None
    if load > HANDOVER_MAX_STREAMS or (now.route.is_main_alone() and not now.measured_here):
        return None
    return _handed_over(planned, now, generated=generated, load=load)


def _off_the_own_engine(*, pair: ModelPair, asked: Asked, planned: Plan, load: int, generated: int) -> Plan | None:
    """A sampled answer the profile sent to the own engine goes on with the main alone as soon as the
    profile says the main alone at the load, whatever the load: the own engine runs each request on its
    own, beside the main alone's batch on the same cores, which slows the whole burst (docs/speculation.md)."""
    if not asked.speculative or asked.k is not None or asked.threshold is not None:
        return None  # the request asked for this engine
    now = plan(pair=pair, asked=asked, load=Load(streams=load))
    if not now.route.is_main_alone():
        return None
    return _handed_over(planned, now, generated=generated, load=load)


def _handed_over(planned: Plan, now: Plan, *, generated: int, load: int) -> Plan:
    """`now`, said to follow the answer's first plan: the reasons it ran on, then the move and the new plan's own."""
    moved = Why(Reason.HANDED_OVER, {"to_k": now.k if now.route.speculates() else None, "token": generated + 1,
                                     "load": load, "then": now.why})
    return replace(now, why=(*planned.why, moved), handed_over=True)
