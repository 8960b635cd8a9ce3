"""The repetition penalty shapes a row as openvino-genai's sampler does (the main alone's answers on the library follow
it), and a verified step's rows as the main alone would have seen each position."""

import numpy as np

from inference.engines.own.penalty import RepetitionPenalty


def test_tokens_of_the_sequence_lose_likelihood_whatever_their_logits_sign():
    penalty = RepetitionPenalty(2.0, [1, 2, 2])
    logits = np.array([3.0, 4.0, -1.0, 5.0], dtype=np.float32)
    shaped = penalty.row(logits)
    assert shaped.tolist() == [3.0, 2.0, -2.0, 5.0]  # positive divided, negative multiplied, each seen token once
    assert logits.tolist() == [3.0, 4.0, -1.0, 5.0]  # the model's own row stays for the logprobs
    assert shaped.dtype == np.float32


def test_a_verified_steps_rows_see_the_proposals_before_them():
    penalty = RepetitionPenalty(2.0, [0])
    rows = np.full((3, 4), 4.0, dtype=np.float32)
    shaped = penalty.rows(rows, [3, 3])  # row i follows the first i proposals
    assert shaped.tolist() == [[2, 4, 4, 4], [2, 4, 4, 2], [2, 4, 4, 2]]


def test_an_answers_new_tokens_join_the_sequence():
    penalty = RepetitionPenalty(1.25, [0])
    penalty.row(np.zeros(4))
    penalty.extend([2])
    assert penalty.row(np.full(4, 5.0)).tolist() == [4.0, 5.0, 4.0, 5.0]
    assert penalty.row(np.full(4, 5.0), ahead=[2, 2, 3]).tolist() == [4.0, 5.0, 4.0, 4.0]
