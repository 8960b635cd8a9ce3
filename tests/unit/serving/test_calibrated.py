"""A host's calibration as the planner and the engines' specs follow it: the table of (pair, request, load,
calibration) -> (route, K, reason codes), the precision each route's engine runs in, and what the admin and
/v1/config say of a calibration (its verdict, in figures and in words)."""

from dataclasses import replace

import pytest
from django.utils import timezone

from inference.engines.decoding import DecodingParams
from inference.models import HostCalibration, JobStatus
from inference.serving import calibrated
from inference.serving.handover import handover
from inference.serving.host import host_of
from inference.serving.reasons import Reason
from inference.serving.records import pair_spec, planned_decoding
from inference.serving.speculation import Asked, HostFigures, Load, plan
from tests.unit.serving.planning import ALONE, LIB, OWN, OWN_ALONE, OWN_K, PROFILED, live, pair

R = Reason
HOST = "AMD EPYC (family 26 model 2; avx512f), 2 cores"
SPECULATES = HostFigures(host=HOST, main_alone_config="defaults", own_config="f32-dynamic", best_k={1: 2})
# where verifying many tokens costs little more than one (the Intel host): K=8, the draft stopping where it is unsure
LONG_STEPS = HostFigures(host=HOST, main_alone_config="f32-dynamic", own_config="f32-dynamic", best_k={1: 8},
                         draft_stop_below=0.5)
LOSES = HostFigures(host=HOST, main_alone_config="f32-dynamic", own_config="f32-dynamic", best_k={1: 0})
# the host's costs timed too (a draft token, the verify of 2, 3, ... tokens): the draft's K follows each answer
COSTED = replace(SPECULATES, best_k={1: 4}, step_costs=(0.3, 0.93, 0.94, 1.01, 1.06))
NOT_YET = HostFigures(host=HOST)
# where the library's pipeline runs the main alone faster (bf16 here) than the own engine's batch, at 4+ streams
LIBRARY_UNDER_LOAD = HostFigures(host=HOST, main_alone_config="bf16", own_config="f32-dynamic", best_k={1: 3},
                                 library_alone={1: False, 4: True})
# the library's main alone faster than the own engine's batch at one stream only (the Intel host, model 167)
LIBRARY_ALONE_ONLY = HostFigures(host=HOST, main_alone_config="f32-dynamic", own_config="f32-dynamic", best_k={1: 2},
                                 library_alone={1: True, 4: False})
# lone answers speculate, but the library's main alone beat the own engine's batch at every load (this Zen 5 host)
SPECULATES_ALONE = HostFigures(host=HOST, main_alone_config="bf16", own_config="f32-dynamic", best_k={1: 3},
                               library_alone={1: True, 4: True})
LIBRARY_ALWAYS = HostFigures(host=HOST, main_alone_config="bf16", own_config="f32-dynamic", best_k={1: 0},
                             library_alone={1: True, 4: True})
# answers beyond the pair's speculating streams speculate at K=2 in the own engine's batch (the Intel host, model 167)
BATCHES = replace(COSTED, batch_k=2)


# (pair fields, request, load, calibration, live figures) -> (route, K, the reasons' codes)
TABLE = [
    # a lone greedy answer on a pair whose own engine serves it: the calibrated K, or the main alone where no K paid
    (OWN, Asked(), Load(streams=1), SPECULATES, None, OWN_K, 2, (R.CALIBRATED_BEST_K, R.OWN_ENGINE)),
    (OWN, Asked(), Load(streams=1), LOSES, None, OWN_ALONE, None,
     (R.CALIBRATED_MAIN_ALONE_FASTER, R.OWN_ENGINE, R.FASTEST_CONFIG)),
    (OWN, Asked(), Load(streams=1), LONG_STEPS, None, OWN_K, 8, (R.CALIBRATED_BEST_K_STOPPED, R.OWN_ENGINE)),
    (OWN, Asked(k=3), Load(streams=1), LONG_STEPS, None, OWN_K, 3, (R.K_ASKED, R.OWN_ENGINE)),  # a K named: no stop
    # a long conversation plans by the long-context line: the main alone where it beat the K there, else the K
    (OWN, Asked(prompt_tokens=1500), Load(streams=1), replace(LONG_STEPS, long_context_k=0), None, OWN_ALONE, None,
     (R.CALIBRATED_LONG_CONTEXT_ALONE, R.OWN_ENGINE, R.FASTEST_CONFIG)),
    (OWN, Asked(prompt_tokens=1500), Load(streams=1), replace(LONG_STEPS, long_context_k=8), None, OWN_K, 8,
     (R.CALIBRATED_BEST_K_STOPPED, R.OWN_ENGINE)),
    (OWN, Asked(prompt_tokens=200), Load(streams=1), replace(LONG_STEPS, long_context_k=0), None, OWN_K, 8,
     (R.CALIBRATED_BEST_K_STOPPED, R.OWN_ENGINE)),
    # ... on the library's main alone where that was the faster main alone after the long prompt (speculation off too)
    (OWN, Asked(prompt_tokens=1500), Load(streams=1), replace(LONG_STEPS, long_context_k=0, long_context_library=True),
     None, ALONE, None, (R.CALIBRATED_LONG_CONTEXT_ALONE, R.FASTEST_CONFIG)),
    (OWN, Asked(prompt_tokens=1500, speculative=False), Load(streams=1), replace(LONG_STEPS, long_context_library=True),
     None, ALONE, None, (R.ASKED_OFF, R.FASTEST_CONFIG)),
    (OWN, Asked(prompt_tokens=1500, k=3), Load(streams=1), replace(LONG_STEPS, long_context_k=0), None, OWN_K, 3,
     (R.K_ASKED, R.OWN_ENGINE)),
    # where the host's costs were timed, the draft proposes up to K what each answer's acceptance pays for; not at a
    # K the request named, nor where the draft stops by its own confidence, nor on the main alone
    (OWN, Asked(), Load(streams=1), COSTED, None, OWN_K, 4, (R.CALIBRATED_BEST_K, R.OWN_ENGINE, R.K_PER_ANSWER)),
    (OWN, Asked(sampled=True), Load(streams=1), COSTED, None, OWN_K, 3,
     (R.PROFILE_BEST_K, R.OWN_ENGINE, R.K_PER_ANSWER)),
    (OWN, Asked(k=3), Load(streams=1), COSTED, None, OWN_K, 3, (R.K_ASKED, R.OWN_ENGINE)),
    (OWN, Asked(), Load(streams=1), replace(LONG_STEPS, step_costs=COSTED.step_costs), None, OWN_K, 8,
     (R.CALIBRATED_BEST_K_STOPPED, R.OWN_ENGINE)),
    (OWN, Asked(), Load(streams=3), COSTED, None, OWN_ALONE, None, (R.BEYOND_OWN_STREAMS, R.OWN_BATCH, R.FASTEST_CONFIG)),
    (PROFILED, Asked(), Load(streams=1), COSTED, None, LIB, 4, (R.PROFILE_BEST_K,)),
    # beyond the load it measured, the profile decides as before; the main alone still runs in the fastest config
    (OWN, Asked(), Load(streams=2), SPECULATES, None, OWN_K, 4, (R.PROFILE_BEST_K, R.OWN_ENGINE)),
    (OWN, Asked(), Load(streams=3), SPECULATES, None, OWN_ALONE, None,
     (R.BEYOND_OWN_STREAMS, R.OWN_BATCH, R.FASTEST_CONFIG)),
    # what the request names outranks the calibration; speculation off runs in the host's fastest configuration
    (OWN, Asked(k=5), Load(streams=1), LOSES, None, OWN_K, 5, (R.K_ASKED, R.OWN_ENGINE)),
    (OWN, Asked(speculative=False), Load(streams=1), SPECULATES, None, OWN_ALONE, None,
     (R.ASKED_OFF, R.OWN_ENGINE, R.FASTEST_CONFIG)),
    (PROFILED, Asked(speculative=False), Load(streams=1), SPECULATES, None, ALONE, None,
     (R.ASKED_OFF, R.FASTEST_CONFIG)),
    (PROFILED, Asked(constrained=True), Load(streams=1), SPECULATES, None, ALONE, None,
     (R.CONSTRAINED, R.FASTEST_CONFIG)),
    # the calibration measured the own engine: a pair served by the library's pipeline keeps its profile's K
    (PROFILED, Asked(), Load(streams=1), LOSES, None, LIB, 4, (R.PROFILE_BEST_K,)),
    # this worker's live figures at the load outrank the calibration
    (OWN, Asked(), Load(streams=1), LOSES, live({0: 10.0, 3: 20.0}), OWN_K, 3, (R.LIVE_K_FASTEST, R.OWN_ENGINE)),
    # sampled answers keep their own profile (the calibration measures greedy answers)
    (OWN, Asked(sampled=True), Load(streams=1), LOSES, None, OWN_K, 3, (R.PROFILE_BEST_K, R.OWN_ENGINE)),
    # where the library's main alone was faster than the own engine's batch, the main alone runs there
    (OWN, Asked(), Load(streams=1), LIBRARY_UNDER_LOAD, None, OWN_K, 3, (R.CALIBRATED_BEST_K, R.OWN_ENGINE)),
    (OWN, Asked(), Load(streams=3), LIBRARY_UNDER_LOAD, None, ALONE, None, (R.BEYOND_OWN_STREAMS, R.FASTEST_CONFIG)),
    (OWN, Asked(), Load(streams=4), LIBRARY_UNDER_LOAD, None, ALONE, None, (R.BEYOND_OWN_STREAMS, R.FASTEST_CONFIG)),
    # a lone answer's main alone stays on the own engine unless the library was faster at one stream too: the same
    # computation of the main as the default answers, so that speculation off writes the same text
    (OWN, Asked(speculative=False), Load(streams=1), LIBRARY_UNDER_LOAD, None, OWN_ALONE, None,
     (R.ASKED_OFF, R.OWN_ENGINE, R.FASTEST_CONFIG)),
    (OWN, Asked(speculative=False), Load(streams=2), LIBRARY_UNDER_LOAD, None, OWN_ALONE, None,
     (R.ASKED_OFF, R.OWN_ENGINE, R.FASTEST_CONFIG)),
    (OWN, Asked(speculative=False), Load(streams=3), LIBRARY_UNDER_LOAD, None, ALONE, None,
     (R.ASKED_OFF, R.FASTEST_CONFIG)),
    (OWN, Asked(), Load(streams=1), replace(LIBRARY_UNDER_LOAD, best_k={1: 0}), None, OWN_ALONE, None,
     (R.CALIBRATED_MAIN_ALONE_FASTER, R.OWN_ENGINE, R.FASTEST_CONFIG)),
    # the library faster at one stream only: one engine for a burst's main alone, the own batch, so a lone one too
    (OWN, Asked(speculative=False), Load(streams=1), LIBRARY_ALONE_ONLY, None, OWN_ALONE, None,
     (R.ASKED_OFF, R.OWN_ENGINE, R.FASTEST_CONFIG)),
    (OWN, Asked(speculative=False), Load(streams=3), LIBRARY_ALONE_ONLY, None, OWN_ALONE, None,
     (R.ASKED_OFF, R.OWN_BATCH, R.FASTEST_CONFIG)),
    (OWN, Asked(), Load(streams=3), LIBRARY_ALONE_ONLY, None, OWN_ALONE, None,
     (R.BEYOND_OWN_STREAMS, R.OWN_BATCH, R.FASTEST_CONFIG)),
    (OWN, Asked(), Load(streams=1), LIBRARY_ALWAYS, None, ALONE, None,
     (R.CALIBRATED_MAIN_ALONE_FASTER, R.FASTEST_CONFIG)),
    (OWN, Asked(speculative=False), Load(streams=1), LIBRARY_ALWAYS, None, ALONE, None,
     (R.ASKED_OFF, R.FASTEST_CONFIG)),
    (OWN, Asked(alternatives=True, speculative=False), Load(streams=9), LIBRARY_ALWAYS, None, OWN_ALONE, None,
     (R.ASKED_OFF, R.ALTERNATIVES, R.FASTEST_CONFIG)),  # only the own engine computes alternatives
    # where speculating in the own engine's batch beat every main alone under load: a burst speculates there, greedy,
    # sampled, under a grammar or at a K named (set aside, and said); a lone answer speculates at its K until more
    # come, then at the batch's; an answer that asked for the main alone runs as one
    (OWN, Asked(), Load(streams=3), BATCHES, None, OWN_K, 2, (R.BEYOND_OWN_STREAMS, R.OWN_BATCH_SPECULATING)),
    (OWN, Asked(sampled=True), Load(streams=3), BATCHES, None, OWN_K, 2,
     (R.BEYOND_OWN_STREAMS, R.OWN_BATCH_SPECULATING)),
    (OWN, Asked(constrained=True), Load(streams=3), BATCHES, None, OWN_K, 2,
     (R.BEYOND_OWN_STREAMS, R.OWN_BATCH_SPECULATING)),
    (OWN, Asked(k=5), Load(streams=3), BATCHES, None, OWN_K, 2,
     (R.K_ASKED, R.BEYOND_OWN_STREAMS, R.OWN_BATCH_SPECULATING)),
    (OWN, Asked(), Load(streams=1), BATCHES, None, OWN_K, 4, (R.CALIBRATED_BEST_K, R.OWN_ENGINE, R.K_PER_ANSWER)),
    (OWN, Asked(speculative=False), Load(streams=3), BATCHES, None, OWN_ALONE, None,
     (R.ASKED_OFF, R.OWN_BATCH, R.FASTEST_CONFIG)),
    # a host with no calibration yet: safe defaults, and the answer says so
    (OWN, Asked(), Load(streams=1), NOT_YET, None, OWN_K, 4, (R.PROFILE_BEST_K, R.OWN_ENGINE, R.NOT_CALIBRATED)),
    ({"own_engine_streams": 1}, Asked(), Load(streams=1), NOT_YET, None, OWN_K, 5,
     (R.PAIR_DEFAULT_K, R.OWN_ENGINE, R.NOT_CALIBRATED)),
]


@pytest.mark.parametrize(("fields", "asked", "load", "calibration", "figures", "route", "k", "codes"), TABLE)
def test_a_calibrated_host_plans_from_what_it_measured(fields, asked, load, calibration, figures, route, k, codes):
    planned = plan(pair=pair(**fields), asked=asked, load=load, calibration=calibration, live=figures)
    assert (planned.route, planned.k, planned.reasons) == (route, k, codes)
    stops = R.CALIBRATED_BEST_K_STOPPED in codes  # the draft stops where unsure only at the K measured so
    assert planned.draft_stop_below == (calibration.draft_stop_below if stops else None)
    assert planned_decoding(DecodingParams(max_new_tokens=8), planned).draft_stop_below == planned.draft_stop_below
    costed = R.K_PER_ANSWER in codes
    decoding = planned_decoding(DecodingParams(max_new_tokens=8), planned)
    assert decoding.step_costs == (calibration.step_costs if costed else ())
    assert decoding.batch_k == (calibration.batch_k if route == OWN_K else 0)  # its K once in the batch


def test_the_costs_a_k_per_answer_weighs_are_the_calibrations_timings_as_shares_of_a_main_token():
    results = {"verify_ms": 40.0, "verify_cost": {"1": 1.0, "2": 0.93, "3": 0.94, "4": 1.01},
               "draft_ms": {"draft": 16.0, "alternative": 12.0}, "draft": "alternative"}
    assert calibrated.step_costs(results) == (0.3, 0.93, 0.94, 1.01)  # the format the own engine loads: 12 ms
    assert calibrated.step_costs({**results, "draft": "draft"})[0] == 0.4
    assert calibrated.step_costs({k: v for k, v in results.items() if k != "draft_ms"}) == ()  # calibrated before


@pytest.mark.parametrize(("asked", "load", "calibration", "moves"), [
    (Asked(), 3, SPECULATES_ALONE, True),  # a burst: its answers run on the library's main alone, this one joins them
    (Asked(), 8, SPECULATES_ALONE, True),  # at any load: the burst's answers prefill at once anyway
    (Asked(sampled=True), 3, SPECULATES_ALONE, True),  # the rest drawn from the main's distribution either way
    (Asked(), 3, LIBRARY_UNDER_LOAD, True),  # the main alone runs where it was faster under load, at every load
    (Asked(), 3, LIBRARY_ALONE_ONLY, False),  # faster at one stream only: the burst runs on the own engine's batch
    (Asked(), 2, SPECULATES_ALONE, False),  # within the pair's own streams: it goes on speculating
    (Asked(), 3, SPECULATES, False),  # the own engine's batch was not slower here: the new answers run there
    (Asked(), 3, NOT_YET, False),
    (Asked(k=3), 3, SPECULATES_ALONE, False),  # the request named its K
    (Asked(alternatives=True), 3, SPECULATES_ALONE, False),  # only the own engine gives alternatives
    (Asked(speculative=False), 3, LIBRARY_UNDER_LOAD, True),  # the main alone asked for, lone on the own engine
    (Asked(speculative=False), 2, LIBRARY_UNDER_LOAD, False),
    (Asked(speculative=False), 3, LIBRARY_ALONE_ONLY, False),
])
def test_a_lone_answer_on_the_own_engine_joins_a_burst_where_the_host_measured_the_library_faster(
        asked, load, calibration, moves):
    own = pair(**OWN)
    lone = plan(pair=own, asked=asked, load=Load(streams=1), calibration=calibration)
    assert lone.route == (OWN_K if asked.speculative else OWN_ALONE)
    moved = handover(pair=own, asked=asked, planned=lone, load=load, generated=40, remaining=100,
                     calibration=calibration)
    assert (moved is not None) == moves
    if moved:
        joining = plan(pair=own, asked=asked, load=Load(streams=load), calibration=calibration)
        assert moved.route == joining.route == ALONE and moved.reasons[-1] == R.HANDED_OVER
        assert f"handed over to the main alone from token 41, {load} running here" in moved.reason
        assert "bf16" in moved.reason and moved.handed_over
        assert handover(pair=own, asked=asked, planned=moved, load=1, generated=60, remaining=80,
                        calibration=calibration) is None  # once
    assert handover(pair=own, asked=asked, planned=lone, load=load, generated=40, remaining=20,
                    calibration=calibration) is None  # too little left to repay the prefill


def test_the_answer_names_the_configuration_its_main_alone_ran_in():
    planned = plan(pair=pair(**OWN), asked=Asked(speculative=False), load=Load(streams=1), calibration=LOSES)
    assert "fastest configuration on this host (f32 with dynamic int8 activations)" in planned.reason
    assert "not calibrated on this host yet" in plan(pair=pair(**OWN), asked=Asked(), load=Load(streams=1),
                                                     calibration=NOT_YET).reason


@pytest.mark.parametrize(("route", "precision", "kv", "quantized"), [
    (ALONE, "", "", True),  # the main alone in the host's fastest: the device's defaults here
    (OWN_K, "f32", "f32", True),  # the own engine in the fastest configuration it is exact in
    (OWN_ALONE, "f32", "f32", True),
    (LIB, "f32", "f32", False),  # the library's speculation keeps the pair's exact f32: greedy identity
])
def test_each_route_runs_in_the_precision_the_host_measured(route, precision, kv, quantized):
    spec = pair_spec(pair=pair(**OWN), route=route, calibration=SPECULATES)
    assert (spec.inference_precision, spec.kv_cache_precision, spec.dynamic_quantization) == (precision, kv, quantized)
    uncalibrated = pair_spec(pair=pair(**OWN), route=route, calibration=NOT_YET)
    assert uncalibrated == pair_spec(pair=pair(**OWN), route=route)
    assert pair_spec(pair=pair(**OWN), route=ALONE, calibration=LIBRARY_ALWAYS).inference_precision == "bf16"


def test_the_own_engine_loads_the_draft_in_the_format_the_host_measured_cheaper():
    fields = {**OWN, "draft_alternative_dir": "d-int8"}
    cheaper_here = replace(SPECULATES, draft_alternative=True)
    for route in (OWN_K, OWN_ALONE):  # the own engine, speculating or not: one engine, one draft
        assert pair_spec(pair=pair(**fields), route=route, calibration=cheaper_here).draft_dir.endswith("/d-int8")
        assert pair_spec(pair=pair(**fields), route=route, calibration=SPECULATES).draft_dir.endswith("/d")
        assert pair_spec(pair=pair(**fields), route=route, calibration=NOT_YET).draft_dir.endswith("/d")
    assert pair_spec(pair=pair(**fields), route=LIB, calibration=cheaper_here).draft_dir.endswith("/d")  # as registered
    assert pair_spec(pair=pair(**OWN), route=OWN_K, calibration=cheaper_here).draft_dir.endswith("/d")  # none other


RESULTS = {
    "configs": {"f32": {"label": "f32, no dynamic quantization", "tokens_per_s": 7.0, "streams": 4,
                        "tokens_per_s_streams": 20.0},
                "f32-dynamic": {"label": "f32 with dynamic int8 activations", "tokens_per_s": 10.0, "streams": 4,
                                "tokens_per_s_streams": 30.0},
                "bf16": {"label": "bf16", "tokens_per_s": 7.2, "streams": 4, "tokens_per_s_streams": 21.0}},
    "fastest": "f32-dynamic", "own_config": "f32-dynamic",
    "own_main_alone": {"tokens_per_s": 9.8},
    "ks": {"2": {"tokens_per_s": 13.0, "identical": 2, "answers": 2},
           "3": {"tokens_per_s": 14.0, "identical": 2, "answers": 2}},
    "best_k": {"1": 3}, "library_alone": {"1": False, "4": True},
}


def summary_of(results: dict) -> dict:
    facts = {"cpu": "AMD EPYC", "family": "26", "model": "2", "isa": ["avx2"], "cores": 2, "openvino": "2026.4.1",
             "device": "CPU"}
    host = host_of(facts)
    return calibrated.summary(HostCalibration(host=host.signature, host_facts=facts, status=JobStatus.FINISHED,
                                              results=results, finished_at=timezone.now()))


def test_a_calibration_says_what_it_decided_in_figures_and_words():
    shown = summary_of(RESULTS)
    assert (shown["fastest_config"], shown["best_k"], shown["speedup"]) == ("f32-dynamic", 3, 1.4)
    assert shown["verdict"].startswith("K=3 makes a lone answer 1.40x as fast as the fastest main alone (f32 with")
    assert "AMD EPYC (family 26 model 2; avx2)" in shown["host"]
    assert (shown["draft_token_ms"], shown["draft"]) == (None, None)  # one draft: nothing was timed
    timed = summary_of({**RESULTS, "draft_ms": {"draft": 47.1, "alternative": 35.6}, "draft": "alternative"})
    assert (timed["draft_token_ms"], timed["draft"]) == ({"draft": 47.1, "alternative": 35.6}, "alternative")
    assert timed["verdict"].endswith("A draft token took 47.1 ms as registered, 35.6 ms in its other weight format: "
                                     "the own engine loads the other format.")
    assert summary_of({**RESULTS, "draft_ms": {"draft": 20.0, "alternative": 30.0}})["draft"] == "draft"
    long_steps = summary_of({**RESULTS, "best_k": {"1": 8}, "ks": {**RESULTS["ks"], "8": {
        "tokens_per_s": 15.0, "identical": 2, "answers": 2, "draft_stop_below": 0.5}}})
    assert (long_steps["best_k"], long_steps["draft_stop_below"], shown["draft_stop_below"]) == (8, 0.5, None)
    assert long_steps["verdict"].startswith("K=8 (the draft stopping at a token it gives below 0.5) makes a lone "
                                            "answer 1.50x as fast")
    losing = summary_of({**RESULTS, "best_k": {"1": 0}})
    assert losing["speedup"] is None
    assert losing["verdict"].startswith("Speculation is slower than the main alone on this host")
    under_load = {**RESULTS, "own_main_alone": {"tokens_per_s": 9.8, "tokens_per_s_streams": 28.0},
                  "fastest_again": {"tokens_per_s": 10.0, "tokens_per_s_streams": 30.0},
                  "batch_ks": {"1": {"tokens_per_s": 36.0}, "2": {"tokens_per_s": 39.0}}}
    batches = summary_of({**under_load, "batch_k": 2})
    assert batches["batch_k"] == 2 and ("Under load answers speculate at K=2 in the own engine's batch: 39.0 tok/s at "
                                        "4 at once, 1.30x the fastest main alone there.") in batches["verdict"]
    assert "no K in the own engine's batch beat the main alone" in summary_of({**under_load, "batch_k": 0})["verdict"]
    assert "Under load" not in shown["verdict"]  # calibrated before the batch's Ks were measured
