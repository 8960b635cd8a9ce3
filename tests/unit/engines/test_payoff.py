"""An answer's drafters sit out while they do not pay for themselves, judged against the main alone's step: bounded by
the quickest verify while they clearly pay, timed in the same answer when in doubt (engines/own/payoff.py)."""

from inference.engines.own.payoff import ALONE_TIMED, FIRST_PAUSE, MEASURE_EVERY, PROBE, WINDOW, Payoff
from inference.limits import Drafter

ALONE_S = 0.1  # the main alone's step: 10 tokens a second
VERIFY_S = 0.11  # a verify of K+1 tokens: about one step of the main alone (AVX-512)


def step(payoff: Payoff, drafter: Drafter | None, *, tokens: int, seconds: float) -> None:
    if drafter is not None:
        assert payoff.proposes(drafter)
    payoff.record(drafter, tokens=tokens, seconds=seconds, verify_seconds=VERIFY_S if drafter else seconds)


def drafted(payoff: Payoff, drafter: Drafter, *, tokens: int, seconds: float, count: int) -> None:
    for _ in range(count):
        step(payoff, drafter, tokens=tokens, seconds=seconds)


def test_a_drafter_that_clearly_pays_goes_on_and_no_step_is_given_away_to_time_the_main_alone():
    payoff = Payoff()
    drafted(payoff, Drafter.DRAFT, tokens=3, seconds=0.2, count=3 * MEASURE_EVERY)  # 15 tokens/s against <= 10
    assert payoff.proposes(Drafter.DRAFT) and not payoff.alone_steps


def test_a_draft_whose_acceptance_collapses_sits_out_within_a_few_steps_then_is_tried_again():
    payoff = Payoff()
    drafted(payoff, Drafter.DRAFT, tokens=3, seconds=0.2, count=WINDOW)
    poor = 0
    while payoff.proposes(Drafter.DRAFT):  # 5 tokens/s from now on: not clearly paying, so the main alone is timed
        step(payoff, Drafter.DRAFT, tokens=1, seconds=0.2)
        poor += 1
    assert poor <= WINDOW and payoff.measuring and payoff.proposes(Drafter.NGRAM) is False
    for _ in range(ALONE_TIMED):
        step(payoff, None, tokens=1, seconds=ALONE_S)
    judged = 0
    while payoff.proposes(Drafter.DRAFT):  # judged against it: collapsed once the poor steps weigh enough
        step(payoff, Drafter.DRAFT, tokens=1, seconds=0.2)
        judged += 1
    assert judged <= WINDOW and payoff.proposes(Drafter.NGRAM)  # the lookup is judged apart
    for _ in range(FIRST_PAUSE):
        step(payoff, None, tokens=1, seconds=ALONE_S)
    step(payoff, Drafter.DRAFT, tokens=1, seconds=1.0)  # catching up on what it sat out: not judged
    drafted(payoff, Drafter.DRAFT, tokens=1, seconds=0.2, count=PROBE)  # still poor, judged on fewer steps: a pause twice as long
    assert payoff.records[Drafter.DRAFT].resumes_at == payoff.tokens + 2 * FIRST_PAUSE


def test_a_window_close_to_the_main_alone_has_not_collapsed():
    payoff = Payoff()
    drafted(payoff, Drafter.DRAFT, tokens=2, seconds=0.22, count=WINDOW)  # 9 tokens/s: in doubt, so timed
    for _ in range(ALONE_TIMED):
        step(payoff, None, tokens=1, seconds=ALONE_S)
    drafted(payoff, Drafter.DRAFT, tokens=2, seconds=0.22, count=4 * WINDOW)
    assert payoff.proposes(Drafter.DRAFT) and len(payoff.alone_steps) == ALONE_TIMED


def test_one_slow_timed_step_does_not_make_a_drafter_that_does_not_pay_look_paying():
    """The main alone's step timed while a neighbour held the core took 5x its time: the median of the steps timed
    in a row is the main alone's, so the costly drafter still sits out."""
    payoff = Payoff()
    drafted(payoff, Drafter.DRAFT, tokens=4, seconds=1.3, count=WINDOW)  # 3 tokens/s against 10
    timed = [5 * ALONE_S] + [ALONE_S] * ALONE_TIMED
    while payoff.measuring:  # the engine's steps propose nothing while it times
        step(payoff, None, tokens=1, seconds=timed.pop(0))
    step(payoff, Drafter.DRAFT, tokens=4, seconds=1.3)
    assert not payoff.proposes(Drafter.DRAFT)


def test_a_drafter_that_pays_again_gets_the_short_pause_back():
    payoff = Payoff()
    step(payoff, None, tokens=1, seconds=ALONE_S)  # a step the draft had nothing for: the main alone timed
    drafted(payoff, Drafter.NGRAM, tokens=1, seconds=0.3, count=WINDOW)
    assert not payoff.proposes(Drafter.NGRAM)
    for _ in range(FIRST_PAUSE):
        step(payoff, None, tokens=1, seconds=ALONE_S)
    drafted(payoff, Drafter.NGRAM, tokens=6, seconds=0.12, count=PROBE)  # the lookup has nothing to catch up on
    assert payoff.records[Drafter.NGRAM].pause == FIRST_PAUSE and payoff.proposes(Drafter.NGRAM)


def test_the_main_alone_is_timed_again_when_its_time_is_old_and_a_window_is_in_doubt():
    payoff = Payoff()
    step(payoff, None, tokens=1, seconds=ALONE_S)
    while payoff.tokens <= 1 + MEASURE_EVERY:
        drafted(payoff, Drafter.DRAFT, tokens=4, seconds=0.2, count=1)
    doubtful = 0
    while not payoff.measuring:
        step(payoff, Drafter.DRAFT, tokens=2, seconds=0.22)
        doubtful += 1
    assert doubtful <= WINDOW
    for _ in range(ALONE_TIMED):
        step(payoff, None, tokens=1, seconds=ALONE_S)
    assert len(payoff.alone_steps) == 1 + ALONE_TIMED and payoff.proposes(Drafter.DRAFT)


def test_fixed_k_proposes_every_step():
    payoff = Payoff(judging=False)
    drafted(payoff, Drafter.DRAFT, tokens=1, seconds=1.0, count=4 * WINDOW)
    assert payoff.proposes(Drafter.DRAFT) and not payoff.measuring
