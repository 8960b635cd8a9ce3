"""A host's calibration as the engines' specs follow it (the planner's rows are in test_planning.py): the figures
read from it, the precision each route's engine runs in, and what the admin and /v1/config say of a calibration
(its verdict, in figures and in words)."""

from dataclasses import replace

import pytest
from django.utils import timezone

from inference.limits import Route
from inference.models import Generation, HostCalibration, JobStatus, ModelPair
from inference.serving import calibrated
from inference.serving.host import host_of
from inference.serving.planning import Asked, Load, plan
from inference.serving.reasons import Reason
from inference.serving.records import pair_spec
from tests.unit.serving.planning import (
    ALONE,
    LIB,
    LIBRARY_FASTER,
    LOSES,
    NOT_YET,
    OWN,
    OWN_ALONE,
    OWN_K,
    SPECULATES,
    pair,
)

R = Reason


def test_the_costs_a_k_per_answer_weighs_are_the_calibrations_timings_as_shares_of_a_main_token():
    results = {"verify_ms": 40.0, "verify_cost": {"1": 1.0, "2": 0.93, "3": 0.94, "4": 1.01},
               "draft_ms": {"draft": 16.0, "alternative": 12.0}, "draft": "alternative"}
    assert calibrated.step_costs(results) == (0.3, 0.93, 0.94, 1.01)  # the format the own engine loads: 12 ms
    assert calibrated.step_costs({**results, "draft": "draft"})[0] == 0.4
    assert calibrated.step_costs({k: v for k, v in results.items() if k != "draft_ms"}) == ()  # calibrated before
    # after the long prompt: its own timings, of the draft the engine loads (timed alone there)
    long = {"long_context": {"verify_ms": 50.0, "verify_cost": {"1": 1.0, "2": 1.1, "3": 1.2},
                             "draft_ms": {"draft": 10.0}}}
    assert calibrated.step_costs({**results, **long}, long=True) == (0.2, 1.1, 1.2)
    assert calibrated.step_costs(results, long=True) == ()  # calibrated before the long line timed them


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
    # where the library's main alone was fastest in bf16: a pair that pipeline serves runs it so; an own pair's main
    # alone runs on its own engine, in the configuration it is exact in
    assert pair_spec(pair=pair(), route=ALONE, calibration=LIBRARY_FASTER).inference_precision == "bf16"
    assert pair_spec(pair=pair(**OWN), route=OWN_ALONE, calibration=LIBRARY_FASTER).inference_precision == "f32"


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
    saved, _ = ModelPair.objects.get_or_create(slug="calibrated", defaults={"main_dir": "m", "draft_dir": "d"})
    return calibrated.summary(HostCalibration(pair=saved, host=host.signature, host_facts=facts,
                                              status=JobStatus.FINISHED, results=results, finished_at=timezone.now()))


def answered(*, route: Route, tokens_per_s: float, count: int = 3) -> None:
    """`count` finished answers of 33 tokens of the calibrated pair, written at `tokens_per_s` after their first."""
    saved = ModelPair.objects.get(slug="calibrated")
    for _ in range(count):
        Generation.objects.create(pair=saved, prompt="p", status=Generation.Status.FINISHED, speculative_route=route,
                                  completion_tokens=33, ttft_ms=100.0, duration_ms=100.0 + 32_000 / tokens_per_s,
                                  finished_at=timezone.now())


@pytest.mark.django_db
def test_every_speed_up_is_weighed_against_one_baseline_the_faster_of_the_calibration_and_the_answers_lately():
    """The figure the admin's list, the pair's page, /v1/config and the chat's line weigh speculation against: the
    main alone as calibrated, or its answers lately where they wrote faster; and the speculative answers lately beside
    the calibrated speed-up."""
    shown = summary_of(RESULTS)
    assert (shown["main_alone_tokens_per_s"], shown["speedup"], shown["speedup_lately"]) == (10.0, 1.4, None)
    answered(route=Route.OWN_MAIN_ALONE, tokens_per_s=12.5)
    answered(route=Route.OWN_SPECULATIVE, tokens_per_s=15.0)
    shown = summary_of(RESULTS)
    assert shown["main_alone_tokens_per_s"] == pytest.approx(12.5)
    assert (shown["main_alone_calibrated_tokens_per_s"], shown["speedup"], shown["speedup_lately"]) == (10.0, 1.12, 1.2)
    assert shown["ks"][3]["speedup"] == pytest.approx(14.0 / 12.5)
    assert shown["verdict"].startswith("K=3 makes a lone answer 1.12x as fast as the main alone's answers lately "
                                       "(12.5 tok/s; its calibration: 10.0)")


@pytest.mark.django_db
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
    assert losing["verdict"].startswith("Speculation is slower than the fastest main alone (f32 with")
    under_load = {**RESULTS, "own_main_alone": {"tokens_per_s": 9.8, "tokens_per_s_streams": 28.0},
                  "fastest_again": {"tokens_per_s": 10.0, "tokens_per_s_streams": 30.0},
                  "batch_ks": {"1": {"tokens_per_s": 36.0}, "2": {"tokens_per_s": 39.0}}}
    batches = summary_of({**under_load, "batch_k": 2})
    assert batches["batch_k"] == 2 and ("Under load answers speculate at K=2 in the own engine's batch: 39.0 tok/s at "
                                        "4 at once, 1.30x the fastest main alone there.") in batches["verdict"]
    assert "no K in the own engine's batch beat the main alone" in summary_of({**under_load, "batch_k": 0})["verdict"]
    assert "Under load" not in shown["verdict"]  # calibrated before the batch's Ks were measured


@pytest.mark.django_db
def test_a_calibration_says_from_which_prompt_length_long_answers_give_up_the_draft():
    """The Intel model 207 host: K=3 1.43x after the short prompts, 6.0 tok/s after a 2,000-token one, where the
    library's main alone made 11.5."""
    long = {"tokens": 2000, "k": 0, "library_alone": True, "from_tokens": 973, "drafted": {"tokens_per_s": 5.95},
            "own_main_alone": {"tokens_per_s": 7.55}, "fastest": {"tokens_per_s": 11.49}}
    shown = summary_of({**RESULTS, "long_context": long})["verdict"]
    assert shown.endswith("After a 2,000-token prompt K=3 made 6.0 tok/s, the main alone 11.5: answers from 973 prompt "
                          "tokens propose from the conversation alone, no draft.")  # on the own engine
    assert "library" not in shown
    before = {key: value for key, value in long.items() if key != "from_tokens"}  # calibrated before it was kept
    assert "answers from 1,000 prompt tokens" in summary_of({**RESULTS, "long_context": before})["verdict"]
    still = summary_of({**RESULTS, "long_context": {**long, "k": 3, "drafted": {"tokens_per_s": 12.5}}})["verdict"]
    assert still.endswith("K=3 made 12.5 tok/s, the main alone 11.5: long answers speculate with the draft too.")
    looked_up = summary_of({**RESULTS, "long_context": {**long, "lookup_only": {"tokens_per_s": 14.2}}})["verdict"]
    assert looked_up.endswith("K=3 made 6.0 tok/s, the conversation's lookup alone 14.2, the main alone 11.5: answers "
                              "from 973 prompt tokens propose from the conversation alone, no draft.")
    assert "After a" not in summary_of(RESULTS)["verdict"]  # no long prompt measured


def test_a_calibration_that_found_the_librarys_main_alone_faster_moves_no_answer_of_an_own_pair(monkeypatch):
    """The calibration still records where the library's pipeline ran the main alone faster than the own engine
    (at one stream, under load, after a long prompt); the plan reads it no more: an own pair's answers, speculating
    or its main alone, run on its own engine, the same computation either way (changed 2026-11-29)."""
    long = {"tokens": 2000, "k": 0, "library_alone": True, "from_tokens": 973, "drafted": {"tokens_per_s": 5.95},
            "own_main_alone": {"tokens_per_s": 7.55}, "fastest": {"tokens_per_s": 11.49}}
    faster = {**RESULTS, "library_alone": {"1": True, "4": True}, "long_context": long}
    host = host_of({"cpu": "AMD EPYC", "family": "26", "model": "2", "isa": ["avx512f"], "cores": 2})

    def figures_of(results: dict):
        found = HostCalibration(host=host.signature, status=JobStatus.FINISHED, results=results,
                                finished_at=timezone.now())
        monkeypatch.setattr(calibrated.selectors, "finished_calibration", lambda **_: found)
        return calibrated.host_figures(pair=pair(**OWN), host=host)

    figures = figures_of(faster)
    without = {key: value for key, value in faster.items() if key != "library_alone"}
    assert figures == figures_of({**without, "long_context": {**long, "library_alone": False}})  # read the same
    assert (figures.best_k, figures.long_context_k, figures.long_context_from) == ({1: 3}, 0, 973)

    def planned(asked: Asked, streams: int):
        return plan(pair=pair(**OWN), asked=asked, load=Load(streams=streams), calibration=figures)

    for asked in (Asked(), Asked(sampled=True), Asked(speculative=False), Asked(prompt_tokens=1500),
                  Asked(prompt_tokens=1500, speculative=False)):
        for streams in (1, 2, 3, 4, 8):
            assert planned(asked, streams).route.is_own_engine(), (asked, streams)
    assert (planned(Asked(), 1).route, planned(Asked(), 1).k) == (OWN_K, 3)
    assert planned(Asked(speculative=False), 1).reasons == (R.ASKED_OFF, R.OWN_ENGINE, R.FASTEST_CONFIG)
    assert planned(Asked(), 4).reasons == (R.BEYOND_OWN_STREAMS, R.OWN_BATCH, R.FASTEST_CONFIG,
                                           R.OWN_BATCH_UNTIL_ALONE)
    long_prompt = planned(Asked(prompt_tokens=1500), 1)
    assert (long_prompt.route, long_prompt.k, long_prompt.lookup_only, long_prompt.reasons) == (
        OWN_K, 3, True, (R.CALIBRATED_LONG_CONTEXT_LOOKUP, R.OWN_ENGINE))
    alone = planned(Asked(prompt_tokens=1500, speculative=False), 1)
    assert "(f32 with dynamic int8 activations)" in alone.reason  # the own engine's configuration
