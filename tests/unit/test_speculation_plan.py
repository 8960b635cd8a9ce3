"""How a request is served, decided without any service running: the plan a worker makes."""

import pytest

from inference.engines.rates import StepRates, streams_bucket
from inference.limits import SpeculativeMode
from inference.models import Generation, ModelPair
from inference.serving.speculation import (
    CONSTRAINED,
    EXACT_THRESHOLD,
    OWN_BATCH,
    Asked,
    handover,
    join_running_batch,
    on_own_engine,
    plan,
)

PROFILE = {"greedy": {"1": 4, "4": 2, "16": 0}, "sampled": {"1": 3, "8": 0}}


def pair(**fields) -> ModelPair:
    defaults = {"slug": "p", "main_dir": "m", "draft_dir": "d", "num_assistant_tokens": 5}
    return ModelPair(**{**defaults, **fields})


@pytest.mark.parametrize(("load", "k", "mode"), [
    (1, 4, SpeculativeMode.DRAFT), (3, 4, SpeculativeMode.DRAFT), (4, 2, SpeculativeMode.DRAFT),
    (15, 2, SpeculativeMode.DRAFT), (16, None, SpeculativeMode.OFF), (40, None, SpeculativeMode.OFF),
])
def test_greedy_k_follows_the_profile_at_the_workers_load(load, k, mode):
    chosen = plan(pair=pair(speculation_profile=PROFILE), asked=Asked(), load=load)
    assert (chosen.mode, chosen.k) == (mode, k)
    assert "measured" in chosen.reason


def test_a_request_that_names_its_k_gets_it_whatever_the_load():
    chosen = plan(pair=pair(speculation_profile=PROFILE), asked=Asked(k=7), load=16)
    assert (chosen.mode, chosen.k, chosen.reason) == (SpeculativeMode.DRAFT, 7, "K asked by the request")


def test_without_a_profile_the_pairs_default_k_or_threshold():
    assert plan(pair=pair(), asked=Asked(), load=8).k == 5
    threshold = plan(pair=pair(num_assistant_tokens=None, assistant_confidence_threshold=0.4), asked=Asked(), load=1)
    assert (threshold.k, threshold.threshold) == (None, 0.4)


@pytest.mark.parametrize(("load", "k", "mode"), [
    (1, 3, SpeculativeMode.EXACT_SAMPLING), (7, 3, SpeculativeMode.EXACT_SAMPLING), (8, None, SpeculativeMode.OFF)])
def test_sampling_runs_on_the_exact_engine_with_the_sampled_profile(load, k, mode):
    chosen = plan(pair=pair(speculation_profile=PROFILE), asked=Asked(sampled=True), load=load)
    assert (chosen.mode, chosen.k, chosen.exact_sampling) == (mode, k, mode == SpeculativeMode.EXACT_SAMPLING)


def test_sampling_never_takes_the_inexact_library_path_unless_the_pair_allows_it():
    asked = plan(pair=pair(), asked=Asked(sampled=True, k=2), load=1)
    assert (asked.mode, asked.k) == (SpeculativeMode.EXACT_SAMPLING, 2)
    threshold = plan(pair=pair(), asked=Asked(sampled=True, threshold=0.3), load=1)
    assert (threshold.mode, threshold.k, threshold.reason) == (SpeculativeMode.EXACT_SAMPLING, 5, EXACT_THRESHOLD)
    allowed = plan(pair=pair(allow_inexact_sampling=True), asked=Asked(sampled=True), load=1)
    assert allowed.mode == SpeculativeMode.INEXACT_SAMPLING and "not drawn" in allowed.reason
    assert not allowed.exact_sampling



def test_under_a_grammar_greedy_speculates_when_it_names_k_and_sampling_runs_on_the_exact_engine():
    """Speculation measured slower under a grammar on the library: a greedy request speculates only when it
    names its K. A sampled answer under one runs on the exact engine, which holds both models to it, never
    on the library's inexact speculative sampling (unless the pair allows that)."""
    greedy = plan(pair=pair(speculation_profile=PROFILE), asked=Asked(constrained=True), load=1)
    assert (greedy.mode, greedy.reason) == (SpeculativeMode.OFF, CONSTRAINED)
    named = plan(pair=pair(), asked=Asked(constrained=True, k=3), load=1)
    assert (named.mode, named.k) == (SpeculativeMode.DRAFT, 3)
    sampled = plan(pair=pair(), asked=Asked(sampled=True, constrained=True, k=3), load=1)
    assert (sampled.mode, sampled.k) == (SpeculativeMode.EXACT_SAMPLING, 3)
    left = plan(pair=pair(speculation_profile=PROFILE), asked=Asked(sampled=True, constrained=True), load=1)
    assert (left.mode, left.k) == (SpeculativeMode.EXACT_SAMPLING, 3)
    allowed = plan(pair=pair(allow_inexact_sampling=True), asked=Asked(sampled=True, constrained=True), load=1)
    assert allowed.mode == SpeculativeMode.INEXACT_SAMPLING

def test_on_the_own_engine_a_grammar_speculates_with_the_pairs_k():
    """The own engine masks the draft by the grammar too (acceptance 0.81 against the library's 0.52 on the real
    pair): an answer it serves alone speculates with the pair's K; beside others, the main alone there, batched."""
    own = pair(own_engine_streams=1, num_assistant_tokens=3)

    def planned(asked: Asked, load: int):
        return on_own_engine(pair=own, asked=asked, planned=plan(pair=own, asked=asked, load=load), load=load)

    alone = planned(Asked(constrained=True), 1)
    assert (alone.mode, alone.k, alone.own_engine) == (SpeculativeMode.DRAFT, 3, True)
    off = planned(Asked(constrained=True, speculative=False), 1)
    assert (off.mode, off.own_engine) == (SpeculativeMode.OFF, True)
    busy = planned(Asked(constrained=True), 2)
    assert (busy.mode, busy.own_engine) == (SpeculativeMode.OFF, True)


def test_the_own_engine_speculates_for_as_many_streams_as_the_pair_gives_it_then_batches_the_main_alone():
    """Up to own_engine_streams answers of the pair here speculate on its own engine, each on its own; beyond
    that, greedy, sampled, constrained and speculative: false answers run on the main alone there, batched (one
    copy of the weights at every load). A request that names its K keeps it (on the library's pipelines)."""
    two = pair(own_engine_streams=2, num_assistant_tokens=3)

    def planned(asked: Asked, load: int):
        return on_own_engine(pair=two, asked=asked, planned=plan(pair=two, asked=asked, load=load), load=load)

    for load, mode in ((1, SpeculativeMode.DRAFT), (2, SpeculativeMode.DRAFT), (3, SpeculativeMode.OFF)):
        assert (planned(Asked(), load).mode, planned(Asked(), load).own_engine) == (mode, True), load
    for asked in (Asked(sampled=True), Asked(constrained=True), Asked(speculative=False)):
        busy = planned(asked, 3)
        assert (busy.mode, busy.k, busy.own_engine) == (SpeculativeMode.OFF, None, True), asked
        assert OWN_BATCH in busy.reason
    assert "speculative: false was asked" in planned(Asked(speculative=False), 3).reason
    named = planned(Asked(k=4), 3)
    assert (named.mode, named.k, named.own_engine) == (SpeculativeMode.DRAFT, 4, False)
    never = pair(own_engine_streams=0)
    for load in (1, 3):
        assert not on_own_engine(pair=never, asked=Asked(), planned=plan(pair=never, asked=Asked(), load=load),
                                 load=load).own_engine


@pytest.mark.parametrize(("fields", "asked", "mode"), [
    ({}, Asked(speculative=False), SpeculativeMode.OFF),
    ({"draft_dir": ""}, Asked(), SpeculativeMode.OFF),
    ({"draft_dir": "", "prompt_lookup": True}, Asked(sampled=True), SpeculativeMode.PROMPT_LOOKUP),
])
def test_modes_without_a_draft_or_speculation(fields, asked, mode):
    assert plan(pair=pair(**fields), asked=asked, load=1).mode == mode


def test_the_profile_takes_a_k_only_where_it_clearly_beats_the_main_alone():
    from inference.benchmark.profile import best_k_by_level

    rows = [{"variant": v, "concurrency": c, "throughput": t} for v, c, t in [
        ("plain", 1, 25.0), ("K=3", 1, 66.0), ("K=5", 1, 84.0),
        ("plain", 16, 114.0), ("K=3", 16, 120.0), ("K=5", 16, 115.0),  # 5% faster: within one burst's noise
        ("plain", 4, 73.0), ("K=3", 4, 31.0), ("K=5", 4, 25.0)]]
    assert best_k_by_level(rows) == {"1": 5, "4": 0, "16": 0}


def test_of_ks_about_as_fast_the_smallest_serves_and_its_shorter_steps_start_joining_requests_sooner():
    """The demo pair's sweep of 2026-11-24 (tok/s, bursts): at 8 streams K=2 is within 3% of K=5, at 4 it is not."""
    from inference.benchmark.profile import best_k_by_level

    rows = [{"variant": v, "concurrency": c, "throughput": t} for v, c, t in [
        ("plain", 4, 119.7), ("K=2", 4, 178.6), ("K=3", 4, 185.0), ("K=5", 4, 212.3),
        ("plain", 8, 168.6), ("K=2", 8, 206.5), ("K=3", 8, 197.4), ("K=5", 8, 209.7),
        ("plain", 16, 205.0), ("K=2", 16, 215.0), ("K=3", 16, 224.0), ("K=5", 16, 230.0)]]
    assert best_k_by_level(rows) == {"4": 5, "8": 2, "16": 5}  # K=3 is as fast at 16 but not 10% over the main
    live = plan(pair=pair(), asked=Asked(), load=8, live={0: 150.0, 2: 201.0, 3: 195.0, 5: 206.0})
    assert (live.mode, live.k) == (SpeculativeMode.DRAFT, 2) and "K=2 201 tok/s" in live.reason


@pytest.mark.parametrize(("asked", "load", "remaining", "moves"), [
    (Asked(sampled=True), 8, 100, True),  # at any load: the exact engine runs beside the main alone's batch
    (Asked(sampled=True), 2, 100, False),  # the profile still says the exact engine below 8 streams
    (Asked(sampled=True), 8, 20, False),  # too little left to repay the prefill
    (Asked(sampled=True, k=3), 8, 100, False),  # the request asked for this engine
])
def test_a_sampled_answer_leaves_the_exact_engine_once_the_profile_says_the_main_alone_at_the_load(
        asked, load, remaining, moves):
    """A burst's first sampled request, planned for one stream, would hold the exact engine while the rest
    of the burst runs on the main alone: it goes on with the main alone (drawn from the main's distribution
    either way), once."""
    profiled = pair(speculation_profile=PROFILE)
    alone = plan(pair=profiled, asked=asked, load=1)
    assert alone.exact_sampling
    moved = handover(pair=profiled, asked=asked, planned=alone, load=load, generated=10, remaining=remaining)
    assert (moved is not None) == moves
    if moved:
        assert (moved.mode, moved.k, moved.handed_over) == (SpeculativeMode.OFF, None, True)
        assert "handed over to the main alone from token 11, 8 running here" in moved.reason
        assert handover(pair=profiled, asked=asked, planned=moved, load=1, generated=20, remaining=90) is None


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
    busy = plan(pair=pair(speculation_profile=PROFILE), asked=asked, load=16)
    moved = handover(pair=pair(speculation_profile=PROFILE), asked=asked, planned=busy, load=load, generated=20,
                     remaining=remaining)
    assert (moved is not None) == moves
    if moved:
        assert (moved.mode, moved.k) == (SpeculativeMode.DRAFT, 4)
        assert moved.reason.startswith(busy.reason) and "handed over to K=4 from token 21" in moved.reason


@pytest.mark.parametrize(("asked", "load", "running", "mode", "k"), [
    (Asked(), 16, (3, 0), SpeculativeMode.DRAFT, 2),  # the speculative batch runs: join it at its highest-load K
    (Asked(), 2, (0, 3), SpeculativeMode.OFF, None),  # the main alone's batch runs: join it
    (Asked(), 16, (0, 3), SpeculativeMode.OFF, None),
    (Asked(), 2, (3, 0), SpeculativeMode.DRAFT, 4),
    (Asked(), 16, (3, 3), SpeculativeMode.OFF, None),  # both run: the profile decides
    (Asked(speculative=False), 1, (3, 0), SpeculativeMode.OFF, None),  # what a request asks, it gets
    (Asked(k=6), 1, (0, 3), SpeculativeMode.DRAFT, 6),
])
def test_a_greedy_request_joins_the_batch_that_runs(asked, load, running, mode, k):
    profiled = pair(speculation_profile=PROFILE)
    joined = join_running_batch(pair=profiled, asked=asked, planned=plan(pair=profiled, asked=asked, load=load),
                                running_speculative=running[0], running_alone=running[1])
    assert (joined.mode, joined.k) == (mode, k)


def test_recent_figures_count_by_the_streams_a_step_served_and_fade():
    rates = StepRates(fresh_s=60, min_step_seconds=0.9)
    assert [streams_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 16)] == [1, 2, 4, 4, 8, 8, 16, 16]
    for step in range(10):
        rates.record(k=0, streams=8, tokens=8, seconds=0.1, at=step)  # 80 tok/s over 1 s of steps
        rates.record(k=5, streams=7, tokens=14, seconds=0.2, at=step)  # 70 tok/s over 2 s
        rates.record(k=5, streams=1, tokens=3, seconds=0.05, at=step)  # 0.5 s: too little to say
    assert rates.at_load(8, now=10) == pytest.approx({0: 80.0, 5: 70.0})
    assert rates.at_load(1, now=10) == {}
    assert rates.at_load(8, now=65) == pytest.approx({5: 70.0})  # the first 5 s of samples have faded
    assert rates.at_load(8, now=200) == {}


@pytest.mark.parametrize(("live", "mode", "k", "decisive"), [
    ({0: 80.0, 5: 70.0}, SpeculativeMode.OFF, None, True),  # the profile says K=2 at 8 streams; here the main won
    ({0: 80.0, 5: 82.0}, SpeculativeMode.OFF, None, False),  # neither clearly faster: the main alone...
    ({0: 80.0, 5: 75.0}, SpeculativeMode.OFF, None, False),  # ...which joins a running batch (below)
    ({0: 80.0, 5: 90.0, 3: 100.0}, SpeculativeMode.DRAFT, 3, True),
    ({5: 90.0}, SpeculativeMode.DRAFT, 2, False),  # the main alone not measured here: the profile decides
    ({0: 80.0}, SpeculativeMode.DRAFT, 2, False),
])
def test_a_workers_recent_figures_at_the_load_outrank_the_profile(live, mode, k, decisive):
    profiled = pair(speculation_profile=PROFILE)
    chosen = plan(pair=profiled, asked=Asked(), load=8, live=live)
    assert (chosen.mode, chosen.k, chosen.measured_here) == (mode, k, decisive)
    assert ("measured here lately at 8 streams" in chosen.reason) == (0 in live and len(live) > 1)
    joined = join_running_batch(pair=profiled, asked=Asked(), planned=chosen, running_speculative=5, running_alone=0)
    assert joined.speculative == (mode == SpeculativeMode.DRAFT or not decisive)  # a clear loser is not joined
    assert plan(pair=profiled, asked=Asked(k=5), load=8, live=live).k == 5
    assert plan(pair=profiled, asked=Asked(sampled=True), load=8, live=live).mode == \
        SpeculativeMode.OFF  # the sampled profile: figures of the library's greedy pipelines say nothing of it


def test_running_answers_move_once_to_a_clearly_faster_path_while_the_batch_is_small():
    profiled = pair(speculation_profile=PROFILE)
    on_k2 = plan(pair=profiled, asked=Asked(), load=8)
    slower_here = {0: 80.0, 2: 60.0}
    assert handover(pair=profiled, asked=Asked(), planned=on_k2, load=8, generated=3, remaining=60,
                    live={0: 80.0, 2: 60.0}) is None  # its prefill would stall the 7 others: new requests follow
    moved = handover(pair=profiled, asked=Asked(), planned=on_k2, load=2, generated=3, remaining=60, live=slower_here)
    assert moved is not None and (moved.mode, moved.k) == (SpeculativeMode.OFF, None)
    assert "handed over to the main alone from token 4, 2 running here" in moved.reason
    assert len(moved.reason) <= Generation._meta.get_field("speculative_reason").max_length  # PostgreSQL enforces it
    assert handover(pair=profiled, asked=Asked(), planned=on_k2, load=2, generated=3, remaining=20,
                    live=slower_here) is None  # too little left to repay the prefill
    assert handover(pair=profiled, asked=Asked(), planned=on_k2, load=2, generated=3, remaining=60,
                    live={0: 80.0, 2: 75.0}) is None  # not clearly faster: no prefill spent on it
    assert handover(pair=profiled, asked=Asked(), planned=moved, load=2, generated=40, remaining=60,
                    live={0: 80.0, 2: 100.0}) is None  # moved once: it stays (figures swing as answers move)
    on_alone = plan(pair=profiled, asked=Asked(), load=16)
    to_k2 = handover(pair=profiled, asked=Asked(), planned=on_alone, load=2, generated=3, remaining=60,
                     live={0: 80.0, 2: 100.0})
    assert to_k2 is not None and (to_k2.mode, to_k2.k) == (SpeculativeMode.DRAFT, 2)


def test_the_load_a_request_plans_for_remembers_the_last_seconds_unless_live_figures_are_off():
    rates, off = StepRates(fresh_s=60, min_step_seconds=1.0), StepRates(fresh_s=0, min_step_seconds=1.0)
    for load in (16, 3):
        rates.note_load(load)
        off.note_load(load)
        off.record(k=0, streams=load, tokens=load, seconds=5.0)
    assert rates.recent_peak(within_s=5) == 16 and off.recent_peak(within_s=5) == 0
    assert rates.recent_peak(within_s=0) == 0
    assert off.at_load(16) == {}


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

    profiled = pair(speculation_profile=PROFILE)
    on_k2 = plan(pair=profiled, asked=Asked(), load=8, live={2: 240.0})
    trying = plan(pair=profiled, asked=Asked(), load=8, live={2: 240.0}, exploring=True)
    assert (on_k2.mode, trying.mode, trying.measured_here) == (SpeculativeMode.DRAFT, SpeculativeMode.OFF, True)
    assert trying.reason == "exploring: the main alone is not measured here lately at 8 streams"
    assert handover(pair=profiled, asked=Asked(), planned=on_k2, load=8, generated=3, remaining=60,
                    live={2: 240.0}, exploring=True) is None  # only new requests explore: a move stalls the batch
    back = plan(pair=profiled, asked=Asked(), load=16, live={0: 80.0}, exploring=True)
    assert (back.mode, back.k) == (SpeculativeMode.DRAFT, 2)  # the profile's highest-load K
    assert plan(pair=profiled, asked=Asked(sampled=True), load=8, live={0: 80.0}, exploring=True).mode == \
        SpeculativeMode.OFF  # sampled requests follow their own profile


def test_a_greedy_answer_with_the_draft_on_a_pair_in_the_fast_mode_says_it_may_differ():
    from inference.serving.speculation import FAST_MODE

    fast = pair(inference_precision="", kv_cache_precision="")
    assert fast.precision_mode == ModelPair.FAST and pair().precision_mode == ModelPair.EXACT
    assert FAST_MODE in plan(pair=fast, asked=Asked(k=3), load=1).reason
    assert FAST_MODE not in plan(pair=pair(), asked=Asked(k=3), load=1).reason
    # the main alone and exact sampling are the main's own output in either mode
    assert FAST_MODE not in plan(pair=fast, asked=Asked(speculative=False), load=1).reason
    assert FAST_MODE not in plan(pair=fast, asked=Asked(k=3, sampled=True), load=1).reason
