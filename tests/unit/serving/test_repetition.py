"""The loop a chat answer is stopped for: a span written again and again, not code that merely repeats a shape."""

from inference.serving.repetition import MAX_PERIOD, MIN_TOKENS, loop_period


def test_a_span_written_over_and_over_is_a_loop_of_its_length():
    answer = list(range(1000, 1090))  # an answer, then a test line of 40 tokens written again and again
    line = list(range(40))
    assert loop_period(answer + line * 3) == 0  # 120 tokens: not yet
    assert loop_period(answer + line * 4) == 40
    assert loop_period([7] * (MIN_TOKENS - 1)) == 0 and loop_period([5, 6] + [7] * MIN_TOKENS) == 1
    paragraph = list(range(MAX_PERIOD))
    assert loop_period(answer + paragraph * 3) == MAX_PERIOD
    assert loop_period(answer + list(range(MAX_PERIOD + 1)) * 3) == 0  # longer spans are left alone


def test_code_that_repeats_a_shape_with_other_names_is_no_loop():
    lines = [token for i in range(60) for token in (1, 2, 3, 100 + i, 4, 5)]  # `x_<i> = f(<i>)`, 60 times
    assert loop_period(lines) == 0
    assert loop_period(lines + [9] * 20) == 0  # a run of 20 equal tokens (a separator line)
