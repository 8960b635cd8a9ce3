"""An answer's drafters sit out while they do not pay for themselves, judged against the main alone's step timed
in the same answer (engines/payoff.py)."""

from inference.engines.payoff import FIRST_PAUSE, MEASURE_EVERY, WINDOW, Payoff
from inference.limits import Drafter

ALONE_S = 0.1  # the main alone's step: 10 tokens a second


def steps(payoff: Payoff, drafter: Drafter, *, tokens: int, seconds: float, count: int) -> None:
    for _ in range(count):
        assert payoff.proposes(drafter)
        payoff.record(drafter, tokens=tokens, seconds=seconds)


def timed(payoff: Payoff) -> None:
    """The step the payoff asks of the main alone first."""
    assert not payoff.proposes(Drafter.DRAFT) and not payoff.proposes(Drafter.NGRAM)
    payoff.record(None, tokens=1, seconds=ALONE_S)


def test_the_first_step_times_the_main_alone_and_a_drafter_that_pays_goes_on():
    payoff = Payoff()
    timed(payoff)
    steps(payoff, Drafter.DRAFT, tokens=3, seconds=0.2, count=5 * WINDOW)  # 15 tokens/s against 10
    steps(payoff, Drafter.DRAFT, tokens=2, seconds=0.22, count=5 * WINDOW)  # 9 tokens/s: close, not collapsed
    assert payoff.proposes(Drafter.DRAFT)


def test_a_draft_whose_acceptance_collapses_sits_out_within_a_few_steps_then_is_tried_again():
    payoff = Payoff()
    timed(payoff)
    steps(payoff, Drafter.DRAFT, tokens=3, seconds=0.2, count=WINDOW)
    poor = 0
    while payoff.proposes(Drafter.DRAFT):  # 5 tokens/s from now on: worse than the main alone
        payoff.record(Drafter.DRAFT, tokens=1, seconds=0.2)
        poor += 1
    assert poor <= WINDOW
    assert payoff.proposes(Drafter.NGRAM)  # the lookup is judged apart
    for _ in range(FIRST_PAUSE):
        payoff.record(None, tokens=1, seconds=ALONE_S)
    assert payoff.proposes(Drafter.DRAFT)
    payoff.record(Drafter.DRAFT, tokens=1, seconds=1.0)  # catching up on what it sat out: not judged
    steps(payoff, Drafter.DRAFT, tokens=1, seconds=0.2, count=WINDOW)  # still poor: a pause twice as long
    assert payoff.records[Drafter.DRAFT].resumes_at == payoff.tokens + 2 * FIRST_PAUSE


def test_a_drafter_that_pays_again_gets_the_short_pause_back():
    payoff = Payoff()
    timed(payoff)
    steps(payoff, Drafter.NGRAM, tokens=1, seconds=0.3, count=WINDOW)
    for _ in range(FIRST_PAUSE):
        payoff.record(None, tokens=1, seconds=ALONE_S)
    steps(payoff, Drafter.NGRAM, tokens=6, seconds=0.12, count=WINDOW)  # the lookup has nothing to catch up on
    assert payoff.records[Drafter.NGRAM].pause == FIRST_PAUSE and payoff.proposes(Drafter.NGRAM)


def test_the_main_alone_is_timed_again_on_a_long_answer():
    payoff = Payoff()
    timed(payoff)
    while payoff.tokens < 1 + MEASURE_EVERY:
        steps(payoff, Drafter.DRAFT, tokens=4, seconds=0.2, count=1)
    timed(payoff)
    assert len(payoff.alone_steps) == 2 and payoff.proposes(Drafter.DRAFT)
