"""How a request is served, decided without any service running: the plan a worker makes, as a table of
(pair, request, load, live figures) -> (route, K, reason codes), and how a running answer moves."""

import pytest

from inference.limits import SpeculativeMode
from inference.models import Generation
from inference.serving.handover import handover
from inference.serving.rates import StepRates
from inference.serving.reasons import Reason
from inference.serving.speculation import Asked, Load, plan
from tests.unit.serving.planning import ALONE, FAST, LIB, LOOKS, LOOKUP, OWN, OWN_ALONE, OWN_K, PROFILED, live, pair

R = Reason


# (pair fields, what the request asked, the load as it joins, this worker's live figures at that load)
#   -> (route, K, the reasons' codes)
TABLE = [
    # greedy, K left to the pair: the profile at the worker's load, else the pair's default
    (PROFILED, Asked(), Load(streams=1), None, LIB, 4, (R.PROFILE_BEST_K,)),
    (PROFILED, Asked(), Load(streams=3), None, LIB, 4, (R.PROFILE_BEST_K,)),
    (PROFILED, Asked(), Load(streams=4), None, LIB, 2, (R.PROFILE_BEST_K,)),
    (PROFILED, Asked(), Load(streams=15), None, LIB, 2, (R.PROFILE_BEST_K,)),
    (PROFILED, Asked(), Load(streams=16), None, ALONE, None, (R.PROFILE_MAIN_ALONE_FASTER,)),
    (PROFILED, Asked(), Load(streams=40), None, ALONE, None, (R.PROFILE_MAIN_ALONE_FASTER,)),
    ({}, Asked(), Load(streams=8), None, LIB, 5, (R.PAIR_DEFAULT_K,)),
    ({"speculation_profile": {"greedy": {"1": -1}}}, Asked(), Load(streams=1), None, LIB, 5,
     (R.PAIR_DEFAULT_K_INVALID_PROFILE,)),
    ({"num_assistant_tokens": None, "assistant_confidence_threshold": 0.4}, Asked(), Load(streams=1), None, LIB, None,
     (R.PAIR_DEFAULT_THRESHOLD,)),
    # what a request names, it gets, whatever the load
    (PROFILED, Asked(k=7), Load(streams=16), None, LIB, 7, (R.K_ASKED,)),
    (PROFILED, Asked(threshold=0.3), Load(streams=1), None, LIB, None, (R.THRESHOLD_ASKED,)),
    (PROFILED, Asked(speculative=False), Load(streams=1), None, ALONE, None, (R.ASKED_OFF,)),
    ({"draft_dir": ""}, Asked(), Load(streams=1), None, ALONE, None, (R.NO_DRAFT,)),
    (LOOKUP, Asked(sampled=True), Load(streams=1), None, LOOKS, 5, (R.PROMPT_LOOKUP,)),
    (LOOKUP, Asked(k=2), Load(streams=1), None, LOOKS, 2, (R.K_ASKED,)),
    # sampling runs on the own engine with the sampled profile, never the library's inexact sampling unless allowed
    (PROFILED, Asked(sampled=True), Load(streams=1), None, OWN_K, 3, (R.PROFILE_BEST_K,)),
    (PROFILED, Asked(sampled=True), Load(streams=7), None, OWN_K, 3, (R.PROFILE_BEST_K,)),
    (PROFILED, Asked(sampled=True), Load(streams=8), None, ALONE, None, (R.PROFILE_MAIN_ALONE_FASTER,)),
    ({}, Asked(sampled=True, k=2), Load(streams=1), None, OWN_K, 2, (R.K_ASKED,)),
    ({}, Asked(sampled=True, threshold=0.3), Load(streams=1), None, OWN_K, 5, (R.EXACT_THRESHOLD,)),
    ({"allow_inexact_sampling": True}, Asked(sampled=True), Load(streams=1), None, LIB, 5,
     (R.INEXACT_ALLOWED, R.PAIR_DEFAULT_K)),
    # under a grammar the library speculates only when K is named; sampled answers stay on the own engine
    (PROFILED, Asked(constrained=True), Load(streams=1), None, ALONE, None, (R.CONSTRAINED,)),
    ({}, Asked(constrained=True, k=3), Load(streams=1), None, LIB, 3, (R.K_ASKED,)),
    ({}, Asked(sampled=True, constrained=True, k=3), Load(streams=1), None, OWN_K, 3, (R.K_ASKED,)),
    (PROFILED, Asked(sampled=True, constrained=True), Load(streams=1), None, OWN_K, 3, (R.PROFILE_BEST_K,)),
    ({"allow_inexact_sampling": True}, Asked(sampled=True, constrained=True), Load(streams=1), None, LIB, 5,
     (R.INEXACT_ALLOWED, R.PAIR_DEFAULT_K)),
    # this worker's recent figures at the load outrank the profile (which says K=2 at 8 streams)
    (PROFILED, Asked(), Load(streams=8), live({0: 80.0, 5: 70.0}), ALONE, None, (R.LIVE_MAIN_ALONE_FASTER,)),
    (PROFILED, Asked(), Load(streams=8), live({0: 80.0, 5: 82.0}), ALONE, None, (R.LIVE_NEITHER_FASTER,)),
    (PROFILED, Asked(), Load(streams=8), live({0: 80.0, 5: 90.0, 3: 100.0}), LIB, 3, (R.LIVE_K_FASTEST,)),
    (PROFILED, Asked(), Load(streams=8), live({5: 90.0}), LIB, 2, (R.PROFILE_BEST_K,)),  # one path: the profile
    (PROFILED, Asked(), Load(streams=8), live({0: 80.0}), LIB, 2, (R.PROFILE_BEST_K,)),
    (PROFILED, Asked(k=5), Load(streams=8), live({0: 80.0, 5: 70.0}), LIB, 5, (R.K_ASKED,)),
    (PROFILED, Asked(sampled=True), Load(streams=8), live({0: 80.0, 5: 90.0}), ALONE, None,
     (R.PROFILE_MAIN_ALONE_FASTER,)),  # the library's greedy figures say nothing of the own engine
    # a worker that measured one path at a load tries the other
    (PROFILED, Asked(), Load(streams=8), live({2: 240.0}, exploring=True), ALONE, None, (R.EXPLORING_MAIN_ALONE,)),
    (PROFILED, Asked(), Load(streams=16), live({0: 80.0}, exploring=True), LIB, 2, (R.EXPLORING_SPECULATION,)),
    (PROFILED, Asked(sampled=True), Load(streams=8), live({0: 80.0}, exploring=True), ALONE, None,
     (R.PROFILE_MAIN_ALONE_FASTER,)),
    # a greedy request joins the batch that runs (the speculative one at the profile's highest-load K)
    (PROFILED, Asked(), Load(streams=16, running_speculative=3), None, LIB, 2,
     (R.PROFILE_MAIN_ALONE_FASTER, R.JOINS_SPECULATIVE_BATCH)),
    (PROFILED, Asked(), Load(streams=2, running_alone=3), None, ALONE, None,
     (R.PROFILE_BEST_K, R.JOINS_MAIN_ALONE_BATCH)),
    (PROFILED, Asked(), Load(streams=16, running_alone=3), None, ALONE, None, (R.PROFILE_MAIN_ALONE_FASTER,)),
    (PROFILED, Asked(), Load(streams=2, running_speculative=3), None, LIB, 4, (R.PROFILE_BEST_K,)),
    (PROFILED, Asked(), Load(streams=16, running_speculative=3, running_alone=3), None, ALONE, None,
     (R.PROFILE_MAIN_ALONE_FASTER,)),  # both run: the profile decides
    (PROFILED, Asked(speculative=False), Load(streams=1, running_speculative=3), None, ALONE, None, (R.ASKED_OFF,)),
    (PROFILED, Asked(k=6), Load(streams=1, running_alone=3), None, LIB, 6, (R.K_ASKED,)),
    (PROFILED, Asked(), Load(streams=8, running_speculative=5), live({0: 80.0, 5: 70.0}), ALONE, None,
     (R.LIVE_MAIN_ALONE_FASTER,)),  # a clear loser is not joined
    (PROFILED, Asked(), Load(streams=8, running_speculative=5), live({0: 80.0, 5: 82.0}), LIB, 2,
     (R.LIVE_NEITHER_FASTER, R.JOINS_SPECULATIVE_BATCH)),
    # a pair with its own engine: up to own_engine_streams answers speculate there, beyond, its main alone batched
    (OWN, Asked(), Load(streams=1), None, OWN_K, 4, (R.PROFILE_BEST_K, R.OWN_ENGINE)),
    (OWN, Asked(), Load(streams=2), None, OWN_K, 4, (R.PROFILE_BEST_K, R.OWN_ENGINE)),
    (OWN, Asked(), Load(streams=3), None, OWN_ALONE, None, (R.BEYOND_OWN_STREAMS, R.OWN_BATCH)),
    (OWN, Asked(sampled=True), Load(streams=3), None, OWN_ALONE, None, (R.BEYOND_OWN_STREAMS, R.OWN_BATCH)),
    (OWN, Asked(constrained=True), Load(streams=3), None, OWN_ALONE, None, (R.BEYOND_OWN_STREAMS, R.OWN_BATCH)),
    (OWN, Asked(speculative=False), Load(streams=3), None, OWN_ALONE, None, (R.ASKED_OFF, R.OWN_BATCH)),
    (OWN, Asked(speculative=False), Load(streams=1), None, OWN_ALONE, None, (R.ASKED_OFF, R.OWN_ENGINE)),
    (OWN, Asked(k=4), Load(streams=3), None, OWN_ALONE, None,  # the K it named set aside: the same answer, batched
     (R.K_ASKED, R.BEYOND_OWN_STREAMS, R.OWN_BATCH)),
    (OWN, Asked(constrained=True), Load(streams=1), None, OWN_K, 3, (R.OWN_CONSTRAINED, R.OWN_ENGINE)),
    (OWN, Asked(threshold=0.3), Load(streams=1), None, LIB, None, (R.THRESHOLD_ASKED,)),  # only the library's
    ({"own_engine_streams": 0}, Asked(), Load(streams=1), None, LIB, 5, (R.PAIR_DEFAULT_K,)),
    # alternatives (top_logprobs) only the own engine computes, at any load
    ({"allow_inexact_sampling": True}, Asked(sampled=True, alternatives=True), Load(streams=1), None, OWN_K, 5,
     (R.PAIR_DEFAULT_K, R.ALTERNATIVES)),
    (PROFILED, Asked(alternatives=True), Load(streams=16), None, OWN_ALONE, None,
     (R.PROFILE_MAIN_ALONE_FASTER, R.ALTERNATIVES)),
    (PROFILED, Asked(speculative=False, alternatives=True), Load(streams=1), None, OWN_ALONE, None,
     (R.ASKED_OFF, R.ALTERNATIVES)),
    # a greedy answer with the draft on a pair in the fast mode says it may differ; the main alone and exact
    # sampling are the main's own output in either mode
    (FAST, Asked(k=3), Load(streams=1), None, LIB, 3, (R.K_ASKED, R.FAST_MODE)),
    (FAST, Asked(k=3, sampled=True), Load(streams=1), None, OWN_K, 3, (R.K_ASKED,)),
    (FAST, Asked(speculative=False), Load(streams=1), None, ALONE, None, (R.ASKED_OFF,)),
]


@pytest.mark.parametrize(("fields", "asked", "load", "figures", "route", "k", "reasons"), TABLE)
def test_the_planner_table(fields, asked, load, figures, route, k, reasons):
    planned = plan(pair=pair(**fields), asked=asked, load=load, live=figures, calibration=None)
    assert (planned.route, planned.k, planned.reasons) == (route, k, reasons)


def test_the_mode_an_answer_states_follows_its_route_and_whether_it_samples():
    def mode(fields: dict, asked: Asked) -> SpeculativeMode:
        return plan(pair=pair(**fields), asked=asked, load=Load(streams=1)).mode

    assert mode(PROFILED, Asked()) == SpeculativeMode.DRAFT
    assert mode(OWN, Asked()) == SpeculativeMode.DRAFT  # greedy on the own engine: the main's output exactly
    assert mode(PROFILED, Asked(sampled=True)) == SpeculativeMode.EXACT_SAMPLING
    assert mode({"allow_inexact_sampling": True}, Asked(sampled=True)) == SpeculativeMode.INEXACT_SAMPLING
    assert mode(LOOKUP, Asked()) == SpeculativeMode.PROMPT_LOOKUP
    assert mode(OWN, Asked(speculative=False)) == mode(PROFILED, Asked(speculative=False)) == SpeculativeMode.OFF


def test_of_ks_about_as_fast_the_smallest_serves_and_its_shorter_steps_start_joining_requests_sooner():
    """The demo pair's sweep of 2026-11-24 (tok/s, bursts): at 8 streams K=2 is within 3% of K=5, at 4 it is not."""
    from inference.benchmark.profile import best_k_by_level

    rows = [{"variant": v, "concurrency": c, "throughput": t} for v, c, t in [
        ("plain", 4, 119.7), ("K=2", 4, 178.6), ("K=3", 4, 185.0), ("K=5", 4, 212.3),
        ("plain", 8, 168.6), ("K=2", 8, 206.5), ("K=3", 8, 197.4), ("K=5", 8, 209.7),
        ("plain", 16, 205.0), ("K=2", 16, 215.0), ("K=3", 16, 224.0), ("K=5", 16, 230.0)]]
    assert best_k_by_level(rows) == {"4": 5, "8": 2, "16": 5}  # K=3 is as fast at 16 but not 10% over the main
    chosen = plan(pair=pair(), asked=Asked(), load=Load(streams=8), live=live({0: 150.0, 2: 201.0, 3: 195.0, 5: 206.0}))
    assert (chosen.route, chosen.k, chosen.reasons) == (LIB, 2, (R.LIVE_K_FASTEST,))


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
