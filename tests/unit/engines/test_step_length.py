"""A draft step's length per answer: up to the plan's K, what this answer's acceptance pays for at the host's costs
(engines/own/step_length.py)."""

from inference.engines.own.step_length import PRIOR_WEIGHT, WINDOW, StepLength

FLAT = (0.3, 0.93, 0.94, 1.01, 1.06, 1.11, 1.18, 1.26)  # the Zen 5 host: a draft token, verifying 2..8 tokens
STEEP = (0.4, 1.26, 1.45, 1.76, 2.40, 2.46, 2.85, 2.92)  # the AVX2 host


def answered(costs: tuple[float, ...], *, steps: int, k: int, accepted: int) -> StepLength:
    length = StepLength(costs)
    for _ in range(steps):
        length.record(proposed=k, accepted=accepted)
    return length


def test_an_answer_the_draft_guesses_well_keeps_the_plans_k():
    assert answered(FLAT, steps=20, k=4, accepted=4).k(4) == 4
    assert answered(FLAT, steps=20, k=4, accepted=4).k(3) == 3  # never above the plan's


def test_an_answer_the_draft_guesses_poorly_proposes_fewer_tokens_a_step():
    poor = answered(FLAT, steps=20, k=4, accepted=0)
    assert poor.acceptance < 0.3 and poor.k(4) == 1
    middling = answered(FLAT, steps=20, k=3, accepted=1)
    assert 1 <= middling.k(4) < 4


def test_where_verifying_more_tokens_costs_more_the_same_acceptance_pays_for_shorter_steps():
    assert answered(STEEP, steps=20, k=3, accepted=2).k(6) < answered(FLAT, steps=20, k=3, accepted=2).k(6)


def test_before_its_own_steps_an_answer_follows_the_prior_and_a_few_steps_move_it():
    fresh = StepLength(FLAT)
    assert fresh.k(4) >= 2  # the prior (0.7) pays for long steps at these costs
    turned = answered(FLAT, steps=PRIOR_WEIGHT, k=4, accepted=0)
    assert turned.k(4) < fresh.k(4)


def test_only_the_last_steps_count_an_answer_that_turns_from_prose_to_code_lengthens_its_steps_again():
    length = answered(FLAT, steps=WINDOW, k=4, accepted=0)
    assert length.k(4) == 1
    for _ in range(WINDOW):
        length.record(proposed=1, accepted=1)
    assert length.k(4) == 4


def test_no_k_beyond_the_longest_verify_the_host_timed():
    assert answered(FLAT[:3], steps=20, k=4, accepted=4).k(8) == 2  # verifying 2 and 3 tokens timed: K <= 2
