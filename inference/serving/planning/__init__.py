"""How a request is served (which route: which engine, drafting or not; which K; and why), decided once, on the
worker, as the request joins its batch: `plan` is a pure function of what the request asked, the pair, the worker's
load and live figures, and the pair's calibration on the host. Two promises shape it: a sampled answer is drawn from
the main's distribution (the own engine's exact rule) unless the pair allows otherwise and says so; and where the main
alone is faster, the main alone serves.

inputs.py holds what a plan reads, choice.py whether it speculates and at which K, rules.py where it runs (one ordered
table), handover.py how a running answer moves; every decision says why as a reason code (serving/reasons.py)."""

from inference.limits import Route
from inference.models import ModelPair
from inference.serving.planning.decision import Plan
from inference.serving.planning.inputs import (
    LONG_CONTEXT_FROM,
    Asked,
    HostFigures,
    LiveFigures,
    Load,
    Situation,
    live_figures,
)
from inference.serving.planning.rules import plan_for

__all__ = ["LONG_CONTEXT_FROM", "Asked", "HostFigures", "LiveFigures", "Load", "Plan", "live_figures",
           "pair_default_route", "plan"]


def plan(*, pair: ModelPair, asked: Asked, load: Load, live: LiveFigures | None = None,
         calibration: HostFigures | None = None) -> Plan:
    """The plan of a request joining a worker where `load` runs; `live`: the worker's recent figures at that load;
    `calibration`: what the pair measured on the worker's host (None: not read)."""
    return plan_for(Situation(pair=pair, asked=asked, load=load, live=live, host=calibration))


def pair_default_route(pair: ModelPair) -> Route:
    """The engine a pair serves as registered, loaded with the pair (ModelPair.own_engine_streams: its own)."""
    return Route.OWN_SPECULATIVE if pair.own_engine_streams else Route.LIBRARY_SPECULATIVE
