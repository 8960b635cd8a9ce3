"""How a running answer moves to another engine of its pair as the load changes (serving/planning/handover.py):
once, and only where the move repays its prefill."""

from dataclasses import replace

import pytest

from inference.models import Generation
from inference.serving.planning import Asked, Load, plan
from inference.serving.planning.handover import handover
from inference.serving.rates import StepRates
from inference.serving.reasons import Reason
from tests.unit.serving.planning import (
    ALONE,
    LIB,
    LIBRARY_FASTER,
    NOT_YET,
    OWN,
    OWN_K,
    PROFILED,
    SPECULATES,
    live,
    pair,
)

R = Reason


@pytest.mark.parametrize(("asked", "load", "remaining", "moves"), [
    (Asked(sampled=True), 8, 100, True),  # at any load: the own engine runs beside the main alone's batch
    (Asked(sampled=True), 2, 100, False),  # the profile still says the own engine below 8 streams
    (Asked(sampled=True), 8, 20, False),  # too little left to repay the prefill
    (Asked(sampled=True, k=3), 8, 100, False),  # the request asked for this engine
    (Asked(sampled=True, alternatives=True), 8, 100, False),  # only the own engine gives alternatives
])
def test_a_sampled_answer_leaves_the_exact_engine_once_the_profile_says_the_main_alone_at_the_load(
        asked, load, remaining, moves):
    """A burst's first sampled request, planned for one stream, would hold the own engine while the rest
    of the burst runs on the main alone: it goes on with the main alone (drawn from the main's distribution
    either way), once."""
    profiled = pair(**PROFILED)
    alone = plan(pair=profiled, asked=asked, load=Load(streams=1))
    assert alone.route == OWN_K
    moved = handover(pair=profiled, asked=asked, planned=alone, load=load, generated=10, remaining=remaining)
    assert (moved is not None) == moves
    if moved:
        assert (moved.route, moved.k, moved.reasons) == (ALONE, None, (R.PROFILE_BEST_K, R.HANDED_OVER))
        assert "handed over to the main alone from token 11, 8 running here" in moved.reason
        assert handover(pair=profiled, asked=asked, planned=moved, load=1, generated=20, remaining=90) is None


def test_an_answer_the_pairs_own_engine_serves_stays_there():
    own = pair(**OWN)
    for asked in (Asked(), Asked(sampled=True), Asked(speculative=False)):
        for load in (1, 3):
            planned = plan(pair=own, asked=asked, load=Load(streams=load))
            assert planned.route.is_own_engine()
            assert handover(pair=own, asked=asked, planned=planned, load=8, generated=3, remaining=100,
                            live=live({0: 80.0, 4: 200.0})) is None


@pytest.mark.parametrize(("asked", "load", "remaining", "moves"), [
    (Asked(), 2, 100, True),
    (Asked(), 3, 100, False),  # the batch is still busy: another prefill would not pay
    (Asked(), 1, 31, False),  # too little left to repay the prefill
    (Asked(speculative=False), 1, 100, False),  # the main alone was asked
    (Asked(k=0), 1, 100, False),
    (Asked(sampled=True), 1, 100, False),
])
def test_an_answer_on_the_main_alone_moves_to_speculation_only_when_the_batch_has_emptied(
        asked, load, remaining, moves):
    profiled = pair(**PROFILED)
    busy = plan(pair=profiled, asked=asked, load=Load(streams=16))
    moved = handover(pair=profiled, asked=asked, planned=busy, load=load, generated=20, remaining=remaining)
    assert (moved is not None) == moves
    if moved:
        assert (moved.route, moved.k, moved.reasons) == (LIB, 4, (R.PROFILE_MAIN_ALONE_FASTER, R.HANDED_OVER))
        assert moved.reason.startswith(busy.reason) and "handed over to K=4 from token 21" in moved.reason


def test_running_answers_move_once_to_a_clearly_faster_path_while_the_batch_is_small():
    profiled = pair(**PROFILED)
    on_k2 = plan(pair=profiled, asked=Asked(), load=Load(streams=8))
    slower_here = live({0: 80.0, 2: 60.0})
    assert handover(pair=profiled, asked=Asked(), planned=on_k2, load=8, generated=3, remaining=60,
                    live=slower_here) is None  # its prefill would stall the 7 others: new requests follow
    moved = handover(pair=profiled, asked=Asked(), planned=on_k2, load=2, generated=3, remaining=60, live=slower_here)
    assert moved is not None and (moved.route, moved.k) == (ALONE, None)
    assert moved.reasons == (R.PROFILE_BEST_K, R.HANDED_OVER) and moved.handed_over
    assert "handed over to the main alone from token 4, 2 running here" in moved.reason
    assert len(moved.reason) <= Generation._meta.get_field("speculative_reason").max_length  # PostgreSQL enforces it
    assert handover(pair=profiled, asked=Asked(), planned=on_k2, load=2, generated=3, remaining=20,
                    live=slower_here) is None  # too little left to repay the prefill
    assert handover(pair=profiled, asked=Asked(), planned=on_k2, load=2, generated=3, remaining=60,
                    live=live({0: 80.0, 2: 75.0})) is None  # not clearly faster: no prefill spent on it
    assert handover(pair=profiled, asked=Asked(), planned=moved, load=2, generated=40, remaining=60,
                    live=live({0: 80.0, 2: 100.0})) is None  # moved once: it stays (figures swing as answers move)
    on_alone = plan(pair=profiled, asked=Asked(), load=Load(streams=16))
    to_k2 = handover(pair=profiled, asked=Asked(), planned=on_alone, load=2, generated=3, remaining=60,
                     live=live({0: 80.0, 2: 100.0}))
    assert to_k2 is not None and (to_k2.route, to_k2.k) == (LIB, 2)


def test_a_worker_that_measured_one_path_at_a_load_tries_the_other_once_per_figures_lifetime():
    rates = StepRates(fresh_s=600, min_step_seconds=1.0)
    for step in range(20):
        rates.record(k=2, streams=8, tokens=24, seconds=0.1, at=step)
        rates.record(k=2, streams=2, tokens=6, seconds=0.1, at=step)
    assert not rates.exploring(2, now=20)  # speculation leads by far at 1-2 streams: never tried away from it
    assert rates.exploring(8, now=20) and rates.exploring(7, now=40)  # a try lasts EXPLORE_FOR_S...
    assert not rates.exploring(8, now=60)
    for step in range(60, 80):
        rates.record(k=0, streams=8, tokens=8, seconds=0.1, at=step)
    assert not rates.exploring(8, now=81)  # ...or until the other path has a figure there
    assert not rates.exploring(8, now=500)
    for step in range(600, 620):
        rates.record(k=2, streams=8, tokens=24, seconds=0.1, at=step)
    assert rates.exploring(8, now=700)  # the main alone's figure faded: tried again

    profiled = pair(**PROFILED)
    on_k2 = plan(pair=profiled, asked=Asked(), load=Load(streams=8), live=live({2: 240.0}))
    assert handover(pair=profiled, asked=Asked(), planned=on_k2, load=8, generated=3, remaining=60,
                    live=live({2: 240.0}, exploring=True)) is None  # only new requests explore: a move stalls the batch


@pytest.mark.parametrize("calibration", [LIBRARY_FASTER, replace(LIBRARY_FASTER, best_k={1: 0}), SPECULATES, NOT_YET])
def test_a_lone_answer_on_the_own_engine_stays_there_when_a_burst_comes(calibration):
    """A burst's answers run in the own engine's batch whatever the host measured of the library's main alone, and
    the lone answer goes on beside them on the same engine (changed 2026-11-29: where the host measured the library's
    main alone faster, the burst ran there and the lone answer was handed over to join it)."""
    own = pair(**OWN)
    for asked in (Asked(), Asked(sampled=True), Asked(speculative=False), Asked(k=3)):
        lone = plan(pair=own, asked=asked, load=Load(streams=1), calibration=calibration)
        assert lone.route.is_own_engine()
        for load in (3, 8):
            joining = plan(pair=own, asked=asked, load=Load(streams=load), calibration=calibration)
            assert joining.route.is_own_engine()
            assert handover(pair=own, asked=asked, planned=lone, load=load, generated=40, remaining=100) is None
