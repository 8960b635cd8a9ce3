"""How a request is served, decided without any service running: the planner as one table of (pair, request, load,
the host's calibration, this worker's live figures) -> (route, K, its K in the own engine's batch, reason codes),
and docs/speculation.md showing the planner's rules and every code.

Every row is what the planner decided before it became one table of rules (serving/planning/rules.py), but the rows
marked "changed"; the rebuilt planner was also run against the old one on 3.35 million combinations of these inputs
and parted only where those rows say (docs/speculation.md#how-the-plan-is-made)."""

from dataclasses import replace
from pathlib import Path

import pytest
from django.conf import settings

from inference.engines.decoding import DecodingParams
from inference.limits import SpeculativeMode
from inference.serving.planning import Asked, Load, plan
from inference.serving.planning.choice import CHOICES
from inference.serving.planning.rules import RULES
from inference.serving.reasons import Reason
from inference.serving.records import planned_decoding
from tests.unit.serving.planning import (
    ALONE,
    BATCHES,
    COSTED,
    FAST,
    LIB,
    LIBRARY_FASTER,
    LONG_STEPS,
    LOOKS,
    LOOKUP,
    LOSES,
    NOT_YET,
    OWN,
    OWN_ALONE,
    OWN_K,
    PROFILED,
    SPECULATES,
    live,
    pair,
)

R = Reason

# (pair fields, what the request asked, the load as it joins, the host's calibration (None: not read), this worker's
#   live figures at that load) -> (route, K, K in the own engine's batch, the reasons' codes). A K the request named
#   is its K in the batch too (changed 2026-11-28: it fell to the host's batch K, 0 where none, once more answers came)
TABLE = [
    # greedy, K left to the pair: the profile at the worker's load, else the pair's default
    (PROFILED, Asked(), Load(streams=1), None, None, LIB, 4, None, (R.PROFILE_BEST_K,)),
    (PROFILED, Asked(), Load(streams=3), None, None, LIB, 4, None, (R.PROFILE_BEST_K,)),
    (PROFILED, Asked(), Load(streams=4), None, None, LIB, 2, None, (R.PROFILE_BEST_K,)),
    (PROFILED, Asked(), Load(streams=15), None, None, LIB, 2, None, (R.PROFILE_BEST_K,)),
    (PROFILED, Asked(), Load(streams=16), None, None, ALONE, None, None, (R.PROFILE_MAIN_ALONE_FASTER,)),
    (PROFILED, Asked(), Load(streams=40), None, None, ALONE, None, None, (R.PROFILE_MAIN_ALONE_FASTER,)),
    ({}, Asked(), Load(streams=8), None, None, LIB, 5, None, (R.PAIR_DEFAULT_K,)),
    ({"speculation_profile": {"greedy": {"1": -1}}}, Asked(), Load(streams=1), None, None,
     LIB, 5, None, (R.PAIR_DEFAULT_K_INVALID_PROFILE,)),
    ({"num_assistant_tokens": None, "assistant_confidence_threshold": 0.4}, Asked(), Load(streams=1), None, None,
     LIB, None, None, (R.PAIR_DEFAULT_THRESHOLD,)),
    # what a request names, it gets, whatever the load
    (PROFILED, Asked(k=7), Load(streams=16), None, None, LIB, 7, None, (R.K_ASKED,)),
    (PROFILED, Asked(threshold=0.3), Load(streams=1), None, None, LIB, None, None, (R.THRESHOLD_ASKED,)),
    (PROFILED, Asked(speculative=False), Load(streams=1), None, None, ALONE, None, None, (R.ASKED_OFF,)),
    ({"draft_dir": ""}, Asked(), Load(streams=1), None, None, ALONE, None, None, (R.NO_DRAFT,)),
    (LOOKUP, Asked(sampled=True), Load(streams=1), None, None, LOOKS, 5, None, (R.PROMPT_LOOKUP,)),
    (LOOKUP, Asked(k=2), Load(streams=1), None, None, LOOKS, 2, None, (R.K_ASKED,)),
    # sampling runs on the own engine with the sampled profile, never the library's inexact sampling unless allowed
    (PROFILED, Asked(sampled=True), Load(streams=1), None, None, OWN_K, 3, None, (R.PROFILE_BEST_K,)),
    (PROFILED, Asked(sampled=True), Load(streams=7), None, None, OWN_K, 3, None, (R.PROFILE_BEST_K,)),
    (PROFILED, Asked(sampled=True), Load(streams=8), None, None, ALONE, None, None, (R.PROFILE_MAIN_ALONE_FASTER,)),
    ({}, Asked(sampled=True, k=2), Load(streams=1), None, None, OWN_K, 2, 2, (R.K_ASKED,)),
    ({}, Asked(sampled=True, threshold=0.3), Load(streams=1), None, None, OWN_K, 5, None, (R.EXACT_THRESHOLD,)),
    ({"allow_inexact_sampling": True}, Asked(sampled=True), Load(streams=1), None, None,
     LIB, 5, None, (R.INEXACT_ALLOWED, R.PAIR_DEFAULT_K)),
    # under a grammar the library speculates only when K is named; sampled answers stay on the own engine
    (PROFILED, Asked(constrained=True), Load(streams=1), None, None, ALONE, None, None, (R.CONSTRAINED,)),
    ({}, Asked(constrained=True, k=3), Load(streams=1), None, None, LIB, 3, None, (R.K_ASKED,)),
    ({}, Asked(sampled=True, constrained=True, k=3), Load(streams=1), None, None, OWN_K, 3, 3, (R.K_ASKED,)),
    (PROFILED, Asked(sampled=True, constrained=True), Load(streams=1), None, None, OWN_K, 3, None, (R.PROFILE_BEST_K,)),
    ({"allow_inexact_sampling": True}, Asked(sampled=True, constrained=True), Load(streams=1), None, None,
     LIB, 5, None, (R.INEXACT_ALLOWED, R.PAIR_DEFAULT_K)),
    # this worker's recent figures at the load outrank the profile (which says K=2 at 8 streams)
    (PROFILED, Asked(), Load(streams=8), None, live({0: 80.0, 5: 70.0}), ALONE, None, None, (R.LIVE_MAIN_ALONE_FASTER,)),
    (PROFILED, Asked(), Load(streams=8), None, live({0: 80.0, 5: 82.0}), ALONE, None, None, (R.LIVE_NEITHER_FASTER,)),
    (PROFILED, Asked(), Load(streams=8), None, live({0: 80.0, 5: 90.0, 3: 100.0}), LIB, 3, None, (R.LIVE_K_FASTEST,)),
    (PROFILED, Asked(), Load(streams=8), None, live({5: 90.0}),
     LIB, 2, None, (R.PROFILE_BEST_K,)),  # one path: the profile
    (PROFILED, Asked(), Load(streams=8), None, live({0: 80.0}), LIB, 2, None, (R.PROFILE_BEST_K,)),
    (PROFILED, Asked(k=5), Load(streams=8), None, live({0: 80.0, 5: 70.0}), LIB, 5, None, (R.K_ASKED,)),
    (PROFILED, Asked(sampled=True), Load(streams=8), None, live({0: 80.0, 5: 90.0}),
     ALONE, None, None, (R.PROFILE_MAIN_ALONE_FASTER,)),  # the library's greedy figures say nothing of the own engine
    # a worker that measured one path at a load tries the other
    (PROFILED, Asked(), Load(streams=8), None, live({2: 240.0}, exploring=True),
     ALONE, None, None, (R.EXPLORING_MAIN_ALONE,)),
    (PROFILED, Asked(), Load(streams=16), None, live({0: 80.0}, exploring=True), LIB, 2, None, (R.EXPLORING_SPECULATION,)),
    (PROFILED, Asked(sampled=True), Load(streams=8), None, live({0: 80.0}, exploring=True),
     ALONE, None, None, (R.PROFILE_MAIN_ALONE_FASTER,)),
    # a greedy request joins the batch that runs (the speculative one at the profile's highest-load K)
    (PROFILED, Asked(), Load(streams=16, running_speculative=3), None, None,
     LIB, 2, None, (R.PROFILE_MAIN_ALONE_FASTER, R.JOINS_SPECULATIVE_BATCH)),
    (PROFILED, Asked(), Load(streams=2, running_alone=3), None, None,
     ALONE, None, None, (R.PROFILE_BEST_K, R.JOINS_MAIN_ALONE_BATCH)),
    (PROFILED, Asked(), Load(streams=16, running_alone=3), None, None, ALONE, None, None, (R.PROFILE_MAIN_ALONE_FASTER,)),
    (PROFILED, Asked(), Load(streams=2, running_speculative=3), None, None, LIB, 4, None, (R.PROFILE_BEST_K,)),
    (PROFILED, Asked(), Load(streams=16, running_speculative=3, running_alone=3), None, None,
     ALONE, None, None, (R.PROFILE_MAIN_ALONE_FASTER,)),  # both run: the profile decides
    (PROFILED, Asked(speculative=False), Load(streams=1, running_speculative=3), None, None,
     ALONE, None, None, (R.ASKED_OFF,)),
    (PROFILED, Asked(k=6), Load(streams=1, running_alone=3), None, None, LIB, 6, None, (R.K_ASKED,)),
    (PROFILED, Asked(), Load(streams=8, running_speculative=5), None, live({0: 80.0, 5: 70.0}),
     ALONE, None, None, (R.LIVE_MAIN_ALONE_FASTER,)),  # a clear loser is not joined
    (PROFILED, Asked(), Load(streams=8, running_speculative=5), None, live({0: 80.0, 5: 82.0}),
     LIB, 2, None, (R.LIVE_NEITHER_FASTER, R.JOINS_SPECULATIVE_BATCH)),
    # a pair with its own engine: up to own_engine_streams answers speculate there, beyond, its main alone batched
    # until the others have ended, then at a lone answer's K (changed 2026-12-08: the main alone to its end)
    (OWN, Asked(), Load(streams=1), None, None, OWN_K, 4, None, (R.PROFILE_BEST_K, R.OWN_ENGINE)),
    (OWN, Asked(), Load(streams=2), None, None, OWN_K, 4, None, (R.PROFILE_BEST_K, R.OWN_ENGINE)),
    (OWN, Asked(), Load(streams=3), None, None, OWN_K, 4, None, (R.BEYOND_OWN_STREAMS, R.OWN_BATCH, R.OWN_BATCH_UNTIL_ALONE)),
    (OWN, Asked(sampled=True), Load(streams=3), None, None, OWN_K, 3, None,
     (R.BEYOND_OWN_STREAMS, R.OWN_BATCH, R.OWN_BATCH_UNTIL_ALONE)),
    (OWN, Asked(constrained=True), Load(streams=3), None, None,
     OWN_ALONE, None, None, (R.BEYOND_OWN_STREAMS, R.OWN_BATCH)),
    (OWN, Asked(speculative=False), Load(streams=3), None, None, OWN_ALONE, None, None, (R.ASKED_OFF, R.OWN_BATCH)),
    (OWN, Asked(speculative=False), Load(streams=1), None, None, OWN_ALONE, None, None, (R.ASKED_OFF, R.OWN_ENGINE)),
    # a K it named, honoured in the batch (changed 2026-11-28: the old planner set it aside and ran the main alone)
    (OWN, Asked(k=4), Load(streams=3), None, None, OWN_K, 4, 4, (R.K_ASKED, R.BEYOND_OWN_STREAMS, R.OWN_BATCH_K_ASKED)),
    (OWN, Asked(constrained=True), Load(streams=1), None, None, OWN_K, 3, None, (R.OWN_CONSTRAINED, R.OWN_ENGINE)),
    (OWN, Asked(threshold=0.3), Load(streams=1), None, None, LIB, None, None, (R.THRESHOLD_ASKED,)),  # only the library's
    ({"own_engine_streams": 0}, Asked(), Load(streams=1), None, None, LIB, 5, None, (R.PAIR_DEFAULT_K,)),
    # alternatives (top_logprobs) only the own engine computes, at any load
    ({"allow_inexact_sampling": True}, Asked(sampled=True, alternatives=True), Load(streams=1), None, None,
     OWN_K, 5, None, (R.PAIR_DEFAULT_K, R.ALTERNATIVES)),
    (PROFILED, Asked(alternatives=True), Load(streams=16), None, None,
     OWN_ALONE, None, None, (R.PROFILE_MAIN_ALONE_FASTER, R.ALTERNATIVES)),
    (PROFILED, Asked(speculative=False, alternatives=True), Load(streams=1), None, None,
     OWN_ALONE, None, None, (R.ASKED_OFF, R.ALTERNATIVES)),
    # a greedy answer with the draft on a pair in the fast mode says it may differ; the main alone and exact
    # sampling are the main's own output in either mode
    (FAST, Asked(k=3), Load(streams=1), None, None, LIB, 3, None, (R.K_ASKED, R.FAST_MODE)),
    (FAST, Asked(k=3, sampled=True), Load(streams=1), None, None, OWN_K, 3, 3, (R.K_ASKED,)),
    (FAST, Asked(speculative=False), Load(streams=1), None, None, ALONE, None, None, (R.ASKED_OFF,)),
    # a lone greedy answer on a pair whose own engine serves it: the calibrated K, or the main alone where no K paid
    (OWN, Asked(), Load(streams=1), SPECULATES, None, OWN_K, 2, None, (R.CALIBRATED_BEST_K, R.OWN_ENGINE)),
    (OWN, Asked(), Load(streams=1), LOSES, None,
     OWN_ALONE, None, None, (R.CALIBRATED_MAIN_ALONE_FASTER, R.OWN_ENGINE, R.FASTEST_CONFIG)),
    (OWN, Asked(), Load(streams=1), LONG_STEPS, None, OWN_K, 8, None, (R.CALIBRATED_BEST_K_STOPPED, R.OWN_ENGINE)),
    (OWN, Asked(k=3), Load(streams=1), LONG_STEPS, None, OWN_K, 3, 3, (R.K_ASKED, R.OWN_ENGINE)),  # a K named: no stop
    # a long conversation plans by the long-context line: the conversation's lookup alone where the draft did not pay
    # there (changed 2026-11-29: the main alone), else the K
    (OWN, Asked(prompt_tokens=1500), Load(streams=1), replace(LONG_STEPS, long_context_k=0), None,
     OWN_K, 8, None, (R.CALIBRATED_LONG_CONTEXT_LOOKUP, R.OWN_ENGINE)),
    (OWN, Asked(prompt_tokens=1500), Load(streams=1), replace(LONG_STEPS, long_context_k=8), None,
     OWN_K, 8, None, (R.CALIBRATED_BEST_K_STOPPED, R.OWN_ENGINE)),
    (OWN, Asked(prompt_tokens=200), Load(streams=1), replace(LONG_STEPS, long_context_k=0), None,
     OWN_K, 8, None, (R.CALIBRATED_BEST_K_STOPPED, R.OWN_ENGINE)),
    # ... from the prompt length where the host's gain fell to nothing (calibration/verdicts.py, long_context_from)
    (OWN, Asked(prompt_tokens=1200), Load(streams=1), replace(LONG_STEPS, long_context_k=0, long_context_from=1400),
     None, OWN_K, 8, None, (R.CALIBRATED_BEST_K_STOPPED, R.OWN_ENGINE)),
    (OWN, Asked(prompt_tokens=800), Load(streams=1), replace(LONG_STEPS, long_context_k=0, long_context_from=700),
     None, OWN_K, 8, None, (R.CALIBRATED_LONG_CONTEXT_LOOKUP, R.OWN_ENGINE)),
    # ... on the own engine, speculation off too and beyond its streams: the same computation as its speculation
    # (changed 2026-11-29: where the library's main alone was faster after the long prompt, these ran there)
    (OWN, Asked(prompt_tokens=1500, speculative=False), Load(streams=1), replace(LONG_STEPS, long_context_k=0), None,
     OWN_ALONE, None, None, (R.ASKED_OFF, R.OWN_ENGINE, R.FASTEST_CONFIG)),
    (OWN, Asked(prompt_tokens=1500), Load(streams=3), replace(LONG_STEPS, long_context_k=0), None,
     OWN_K, 4, None, (R.BEYOND_OWN_STREAMS, R.OWN_BATCH, R.FASTEST_CONFIG, R.OWN_BATCH_UNTIL_ALONE)),
    (OWN, Asked(prompt_tokens=1500, k=3), Load(streams=1), replace(LONG_STEPS, long_context_k=0), None,
     OWN_K, 3, 3, (R.K_ASKED, R.OWN_ENGINE)),
    # where the host's costs were timed, the draft proposes up to K what each answer's acceptance pays for; not at a
    # K the request named, nor where the draft stops by its own confidence, nor on the main alone
    (OWN, Asked(), Load(streams=1), COSTED, None, OWN_K, 4, None, (R.CALIBRATED_BEST_K, R.OWN_ENGINE, R.K_PER_ANSWER)),
    (OWN, Asked(sampled=True), Load(streams=1), COSTED, None,
     OWN_K, 3, None, (R.PROFILE_BEST_K, R.OWN_ENGINE, R.K_PER_ANSWER)),
    (OWN, Asked(k=3), Load(streams=1), COSTED, None, OWN_K, 3, 3, (R.K_ASKED, R.OWN_ENGINE)),
    (OWN, Asked(), Load(streams=1), replace(LONG_STEPS, step_costs=COSTED.step_costs), None,
     OWN_K, 8, None, (R.CALIBRATED_BEST_K_STOPPED, R.OWN_ENGINE)),
    (OWN, Asked(), Load(streams=3), COSTED, None,
     OWN_K, 4, None, (R.BEYOND_OWN_STREAMS, R.OWN_BATCH, R.FASTEST_CONFIG, R.OWN_BATCH_UNTIL_ALONE, R.K_PER_ANSWER)),
    (PROFILED, Asked(), Load(streams=1), COSTED, None, LIB, 4, None, (R.PROFILE_BEST_K,)),
    # beyond the load it measured, the profile decides as before; the main alone still runs in the fastest config
    (OWN, Asked(), Load(streams=2), SPECULATES, None, OWN_K, 4, None, (R.PROFILE_BEST_K, R.OWN_ENGINE)),
    (OWN, Asked(), Load(streams=3), SPECULATES, None,
     OWN_K, 4, None, (R.BEYOND_OWN_STREAMS, R.OWN_BATCH, R.FASTEST_CONFIG, R.OWN_BATCH_UNTIL_ALONE)),
    # what the request names outranks the calibration; speculation off runs in the host's fastest configuration
    (OWN, Asked(k=5), Load(streams=1), LOSES, None, OWN_K, 5, 5, (R.K_ASKED, R.OWN_ENGINE)),
    (OWN, Asked(speculative=False), Load(streams=1), SPECULATES, None,
     OWN_ALONE, None, None, (R.ASKED_OFF, R.OWN_ENGINE, R.FASTEST_CONFIG)),
    (PROFILED, Asked(speculative=False), Load(streams=1), SPECULATES, None,
     ALONE, None, None, (R.ASKED_OFF, R.FASTEST_CONFIG)),
    (PROFILED, Asked(constrained=True), Load(streams=1), SPECULATES, None,
     ALONE, None, None, (R.CONSTRAINED, R.FASTEST_CONFIG)),
    # the calibration measured the own engine: a pair served by the library's pipeline keeps its profile's K
    (PROFILED, Asked(), Load(streams=1), LOSES, None, LIB, 4, None, (R.PROFILE_BEST_K,)),
    # this worker's live figures at the load outrank the calibration
    (OWN, Asked(), Load(streams=1), LOSES, live({0: 10.0, 3: 20.0}), OWN_K, 3, None, (R.LIVE_K_FASTEST, R.OWN_ENGINE)),
    # sampled answers keep their own profile (the calibration measures greedy answers)
    (OWN, Asked(sampled=True), Load(streams=1), LOSES, None, OWN_K, 3, None, (R.PROFILE_BEST_K, R.OWN_ENGINE)),
    # where the library's pipeline ran the main alone faster (bf16), an own pair's main alone stays on its own engine,
    # lone or beyond its streams, in the configuration it is exact in: switching speculation off, or more answers
    # coming, never changes an answer (changed 2026-11-29: the rows beyond its streams, and the lone main alone where
    # the library was faster at one stream too, ran on the library's main alone)
    (OWN, Asked(), Load(streams=1), LIBRARY_FASTER, None, OWN_K, 3, None, (R.CALIBRATED_BEST_K, R.OWN_ENGINE)),
    (OWN, Asked(), Load(streams=3), LIBRARY_FASTER, None,
     OWN_K, 4, None, (R.BEYOND_OWN_STREAMS, R.OWN_BATCH, R.FASTEST_CONFIG, R.OWN_BATCH_UNTIL_ALONE)),
    (OWN, Asked(), Load(streams=4), LIBRARY_FASTER, None,
     OWN_K, 4, None, (R.BEYOND_OWN_STREAMS, R.OWN_BATCH, R.FASTEST_CONFIG, R.OWN_BATCH_UNTIL_ALONE)),
    (OWN, Asked(sampled=True), Load(streams=3), LIBRARY_FASTER, None,
     OWN_K, 3, None, (R.BEYOND_OWN_STREAMS, R.OWN_BATCH, R.FASTEST_CONFIG, R.OWN_BATCH_UNTIL_ALONE)),
    (OWN, Asked(speculative=False), Load(streams=1), LIBRARY_FASTER, None,
     OWN_ALONE, None, None, (R.ASKED_OFF, R.OWN_ENGINE, R.FASTEST_CONFIG)),
    (OWN, Asked(speculative=False), Load(streams=2), LIBRARY_FASTER, None,
     OWN_ALONE, None, None, (R.ASKED_OFF, R.OWN_ENGINE, R.FASTEST_CONFIG)),
    (OWN, Asked(speculative=False), Load(streams=3), LIBRARY_FASTER, None,
     OWN_ALONE, None, None, (R.ASKED_OFF, R.OWN_BATCH, R.FASTEST_CONFIG)),
    (OWN, Asked(), Load(streams=1), replace(LIBRARY_FASTER, best_k={1: 0}), None,
     OWN_ALONE, None, None, (R.CALIBRATED_MAIN_ALONE_FASTER, R.OWN_ENGINE, R.FASTEST_CONFIG)),
    (OWN, Asked(alternatives=True, speculative=False), Load(streams=9), replace(LIBRARY_FASTER, best_k={1: 0}), None,
     OWN_ALONE, None, None, (R.ASKED_OFF, R.ALTERNATIVES, R.FASTEST_CONFIG)),  # only the own engine computes alternatives
    # a pair the library's pipeline serves runs its main alone there, in the configuration measured fastest
    (PROFILED, Asked(speculative=False), Load(streams=1), LIBRARY_FASTER, None,
     ALONE, None, None, (R.ASKED_OFF, R.FASTEST_CONFIG)),
    # where speculating in the own engine's batch beat every main alone under load: a burst speculates there, greedy,
    # sampled, under a grammar or at a K named (set aside, and said); a lone answer speculates at its K until more
    # come, then at the batch's; an answer that asked for the main alone runs as one
    (OWN, Asked(), Load(streams=3), BATCHES, None, OWN_K, 2, 2, (R.BEYOND_OWN_STREAMS, R.OWN_BATCH_SPECULATING)),
    (OWN, Asked(sampled=True), Load(streams=3), BATCHES, None,
     OWN_K, 2, 2, (R.BEYOND_OWN_STREAMS, R.OWN_BATCH_SPECULATING)),
    (OWN, Asked(constrained=True), Load(streams=3), BATCHES, None,
     OWN_K, 2, 2, (R.BEYOND_OWN_STREAMS, R.OWN_BATCH_SPECULATING)),
    (OWN, Asked(k=5), Load(streams=3), BATCHES, None,  # the K it named, not the batch's (changed, as above)
     OWN_K, 5, 5, (R.K_ASKED, R.BEYOND_OWN_STREAMS, R.OWN_BATCH_K_ASKED)),
    (OWN, Asked(), Load(streams=1), BATCHES, None, OWN_K, 4, 2, (R.CALIBRATED_BEST_K, R.OWN_ENGINE, R.K_PER_ANSWER)),
    (OWN, Asked(speculative=False), Load(streams=3), BATCHES, None,
     OWN_ALONE, None, None, (R.ASKED_OFF, R.OWN_BATCH, R.FASTEST_CONFIG)),
    # a host with no calibration yet: safe defaults, and the answer says so
    (OWN, Asked(), Load(streams=1), NOT_YET, None, OWN_K, 4, None, (R.PROFILE_BEST_K, R.OWN_ENGINE, R.NOT_CALIBRATED)),
    ({"own_engine_streams": 1}, Asked(), Load(streams=1), NOT_YET, None,
     OWN_K, 5, None, (R.PAIR_DEFAULT_K, R.OWN_ENGINE, R.NOT_CALIBRATED)),
]


@pytest.mark.parametrize(("fields", "asked", "load", "calibration", "figures", "route", "k", "batch_k", "codes"), TABLE)
def test_the_planner_table(fields, asked, load, calibration, figures, route, k, batch_k, codes):
    planned = plan(pair=pair(**fields), asked=asked, load=load, live=figures, calibration=calibration)
    assert (planned.route, planned.k, planned.batch_k, planned.reasons) == (route, k, batch_k, codes)
    stops = R.CALIBRATED_BEST_K_STOPPED in codes  # the draft stops where unsure only at the K measured so
    assert planned.draft_stop_below == (calibration.draft_stop_below if stops else None)
    # the engine is handed one value: how the answer speculates, none for a main alone
    handed = planned_decoding(DecodingParams(max_new_tokens=8), planned).speculation
    assert (handed is None) == route.is_main_alone()
    if handed is not None:
        assert (handed.k, handed.threshold, handed.batch_k) == (k, planned.threshold, batch_k)
        assert handed.draft_stop_below == planned.draft_stop_below
        assert handed.step_costs == (calibration.step_costs if R.K_PER_ANSWER in codes else ())
        # the conversation's lookup alone proposes exactly where the long-context line says the draft did not pay
        assert handed.lookup_only == (R.CALIBRATED_LONG_CONTEXT_LOOKUP in codes)


def test_a_long_prompts_answer_weighs_its_k_at_the_costs_timed_after_a_long_prompt():
    """After a pasted file a verify weighs more against a main token, and a draft token less, than after a short
    prompt: a long prompt's answer is handed the costs the calibration timed there, a short one's the short ones, and
    a host calibrated before the long costs were timed hands the short ones to both."""
    timed_long = replace(COSTED, long_step_costs=(0.2, 1.1, 1.2, 1.35, 1.5), long_context_k=4)
    for calibration, prompt_tokens, costs in ((timed_long, 200, COSTED.step_costs),
                                              (timed_long, 1500, timed_long.long_step_costs),
                                              (COSTED, 1500, COSTED.step_costs)):
        planned = plan(pair=pair(**OWN), asked=Asked(prompt_tokens=prompt_tokens), load=Load(streams=1),
                       calibration=calibration)
        assert (planned.route, planned.k) == (OWN_K, 4)
        assert R.K_PER_ANSWER in planned.reasons and planned.step_costs == costs, prompt_tokens
        assert planned_decoding(DecodingParams(max_new_tokens=8), planned).speculation.step_costs == costs


def test_the_docs_show_every_rule_and_every_reason_code():
    """docs/speculation.md is the planner's reference: both tables' rules, in order, and every reason code."""
    text = (Path(settings.BASE_DIR) / "docs" / "speculation.md").read_text()
    for heading, table in (("### Whether it speculates", CHOICES), ("### Where it runs", RULES)):
        section = text[text.index(heading):]
        section = section[:section.find("\n## ")] if "\n## " in section else section
        section = section[:section.find("\n### ", 4)] if "\n### " in section[4:] else section
        positions = [section.find(f"`{rule.__name__}`") for rule in table]
        assert -1 not in positions and positions == sorted(positions), heading
    assert [code.value for code in Reason if f"`{code.value}`" not in text] == []


def test_the_mode_an_answer_states_follows_its_route_and_whether_it_samples():
    def mode(fields: dict, asked: Asked) -> SpeculativeMode:
        return plan(pair=pair(**fields), asked=asked, load=Load(streams=1)).mode

    assert mode(PROFILED, Asked()) == SpeculativeMode.DRAFT
    assert mode(OWN, Asked()) == SpeculativeMode.DRAFT  # greedy on the own engine: the main's output exactly
    assert mode(PROFILED, Asked(sampled=True)) == SpeculativeMode.EXACT_SAMPLING
    assert mode({"allow_inexact_sampling": True}, Asked(sampled=True)) == SpeculativeMode.INEXACT_SAMPLING
    assert mode(LOOKUP, Asked()) == SpeculativeMode.PROMPT_LOOKUP
    long_prompt = plan(pair=pair(**OWN), asked=Asked(prompt_tokens=1500), load=Load(streams=1),
                       calibration=replace(LONG_STEPS, long_context_k=0))
    assert long_prompt.mode == SpeculativeMode.PROMPT_LOOKUP  # the own engine's lookup, no draft
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
