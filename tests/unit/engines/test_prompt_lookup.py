"""The prompt lookup (engines/own/proposers/prompt_lookup.py) proposes what followed the history's last tokens where they occur in the
prompt, from an index built once, further the longer they matched; and the rule for its proposals (accept_fixed) keeps
the main's law."""

from collections import Counter

import numpy as np
import pytest

from inference.engines.decoding import Sampling
from inference.engines.own.acceptance import accept, accept_fixed, greedy_accept
from inference.engines.own.proposers.prompt_lookup import (
    BATCH_MATCHED,
    LONGEST_LOOKUP,
    LOOKUP_TOKENS,
    MIN_NGRAM,
    PromptLookup,
)


def scanned(prompt: list[int], history: list[int], *, max_ngram: int, length: int, limit: int) -> list[int]:
    """The same proposal by scanning the prompt backwards: what the index must agree with."""
    for n in range(max_ngram, MIN_NGRAM - 1, -1):
        if len(history) <= n:
            continue
        suffix = history[-n:]
        for start in range(len(prompt) - n - 1, -1, -1):  # an occurrence followed by a token of the prompt
            if prompt[start:start + n] == suffix:
                end = start + n
                matched = next((i for i in range(min(end, LONGEST_LOOKUP)) if prompt[end - 1 - i] != history[-1 - i]),
                               min(end, LONGEST_LOOKUP))
                return history[end:end + min(limit, max(length, matched))]
    return []


def test_what_followed_the_last_tokens_in_the_prompt_is_proposed():
    prompt = [5, 6, 7, 8, 9, 1, 2, 3, 4, 10, 11, 6, 7]
    assert PromptLookup(prompt, max_ngram=3).propose(8) == [8, 9, 1, 2, 3, 4, 10, 11]
    assert PromptLookup(prompt, max_ngram=3, length=3).propose(8) == [8, 9, 1]
    assert PromptLookup(prompt, max_ngram=3).propose(2) == [8, 9]  # the room left before the cap
    assert PromptLookup(prompt, max_ngram=3).propose(0) == []


def test_the_answers_last_tokens_are_looked_up_in_the_prompt_and_run_on_into_the_answer():
    lookup = PromptLookup([1, 2, 3, 4, 20, 21], max_ngram=3)
    lookup.extend([2, 3])
    assert lookup.propose(8) == [4, 20, 21, 2, 3]
    lookup.extend([4, 5, 6, 7, 5, 6])  # (5, 6) is only in the answer: no proposal from there
    assert lookup.propose(8) == []


def test_the_longest_match_wins_over_a_later_shorter_one_and_the_latest_among_equals():
    history = [1, 2, 3, 40, 9, 2, 3, 50, 1, 2, 3]
    assert PromptLookup(history, max_ngram=3).propose(8) == [40, 9, 2, 3, 50, 1, 2, 3]  # [1, 2, 3] before 40
    assert PromptLookup(history, max_ngram=2).propose(8) == [50, 1, 2, 3]  # [2, 3]'s latest, before 50
    assert PromptLookup([1, 2, 3, 40, 1, 2, 3, 60, 1, 2, 3], max_ngram=3).propose(8) == [60, 1, 2, 3]


def test_a_longer_match_proposes_further_up_to_the_longest_lookup():
    pasted = list(range(100, 200))
    lookup = PromptLookup([*pasted, 7], max_ngram=3)
    lookup.extend(pasted[:3])  # the answer starts copying the paste: a short match, the lookup's length
    assert lookup.propose(64) == pasted[3:11]
    lookup.extend(pasted[3:20])  # 20 tokens copied: 20 proposed
    assert lookup.propose(64) == pasted[20:40]
    lookup.extend(pasted[20:60])
    assert lookup.propose(64) == pasted[60:60 + LONGEST_LOOKUP]
    assert lookup.propose(5) == pasted[60:65]  # never past the room left
    lookup.extend([1, *pasted[61:64]])  # a change, then copying again: trusted as far as the new match
    assert lookup.propose(64) == pasted[64:72]


def test_in_the_batch_the_lookup_proposes_only_where_the_answer_copies_and_a_short_run():
    """Other answers wait for a batched answer's verify: a match shorter than BATCH_MATCHED tokens proposes nothing
    there (a question's answer meets the paste's n-grams by chance), a longer one the lookup's length at most."""
    pasted = list(range(100, 200))
    lookup = PromptLookup([*pasted, 7], max_ngram=3)
    lookup.batched()
    lookup.extend(pasted[:BATCH_MATCHED - 1])
    assert lookup.propose(64) == []
    lookup.extend(pasted[BATCH_MATCHED - 1:40])  # copying: 40 tokens matched
    assert lookup.propose(64) == pasted[40:40 + LOOKUP_TOKENS]
    assert lookup.propose(3) == pasted[40:43]
    lookup.extend([1, *pasted[41:44]])  # a change: three tokens matched again, too few
    assert lookup.propose(64) == []


def test_nothing_is_proposed_without_an_earlier_occurrence():
    assert PromptLookup([1, 2, 3, 4, 5, 6], max_ngram=3).propose(8) == []
    assert PromptLookup([7, 7], max_ngram=3).propose(8) == []  # the last tokens are no earlier occurrence of themselves
    assert PromptLookup([1, 2, 9, 2], max_ngram=3).propose(8) == []  # one token in common is not enough
    assert PromptLookup([], max_ngram=3).propose(8) == []


def test_a_loop_proposes_its_period_up_to_the_newest_token():
    assert PromptLookup([4, 1, 2, 1, 2], max_ngram=3).propose(8) == [1, 2]
    assert PromptLookup([7, 7, 7], max_ngram=3).propose(8) == [7]


@pytest.mark.parametrize("max_ngram", [1, 2, 3, 4])
def test_answers_added_one_by_one_or_in_runs_propose_what_a_scan_of_the_prompt_finds(max_ngram):
    rng = np.random.default_rng(max_ngram)
    history = rng.integers(0, 6, 400).tolist()  # a small vocabulary: matches of every length, often
    prompt = history[:150]
    lookup = PromptLookup(prompt, max_ngram=max_ngram, length=5)
    position = len(prompt)
    while position < len(history):
        run = int(rng.integers(1, 6))
        lookup.extend(history[position:position + run])
        position = min(position + run, len(history))
        for limit in (1, 3, 8):
            assert lookup.propose(limit) == scanned(prompt, history[:position], max_ngram=max(max_ngram, MIN_NGRAM),
                                                    length=5, limit=limit), position


def law(p: list[np.ndarray], proposals: list[int]) -> dict[tuple[int, int], float]:
    """P(accepted, token) of the exact rule for fixed proposals (q one-hot): keep x_i with p_i(x_i), else draw
    the main's token from p_i without x_i."""
    outcomes, kept = {}, 1.0
    for i, x in enumerate(proposals):
        for y in range(len(p[i])):
            if y != x:
                outcomes[(i, y)] = kept * p[i][y]
        kept *= p[i][x]
    for y in range(len(p[-1])):
        outcomes[(len(proposals), y)] = kept * p[-1][y]
    return outcomes


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_fixed_proposals_are_kept_by_the_main_as_the_rule_with_a_one_hot_q_keeps_them(temperature):
    """accept_fixed (no one-hot arrays) and accept with one-hot q's both follow the rule's law, outcome by outcome."""
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((3, 6)) * 1.5
    params = Sampling(temperature=temperature)
    proposals = [int(np.argmax(logits[0])), int(np.argsort(logits[1])[-2])]  # a likely one, then a second choice
    shaped = [np.exp(row / temperature) / np.exp(row / temperature).sum() for row in logits.astype(np.float64)]
    expected = law(shaped, proposals)
    one_hot = [np.eye(6)[x] for x in proposals]
    n = 40_000
    for rule in (lambda r: accept_fixed(proposals, logits, params=params, rng=r),
                 lambda r: accept(proposals, one_hot, logits, params=params, rng=r)):
        draws = np.random.default_rng(11)
        counts = Counter(rule(draws) for _ in range(n))
        for outcome, probability in expected.items():
            sigma = np.sqrt(probability * (1 - probability) / n)
            assert abs(counts[outcome] / n - probability) < 5 * sigma + 1e-4, (outcome, counts[outcome] / n, probability)


def test_at_temperature_zero_fixed_proposals_are_kept_while_they_are_the_mains_argmax():
    logits = np.random.default_rng(5).standard_normal((4, 50))
    best = logits.argmax(axis=-1).tolist()
    for proposals in (best[:3], [best[0], best[1], 0 if best[2] else 1], [0 if best[0] else 1, best[1], best[2]]):
        assert accept_fixed(proposals, logits, params=Sampling(), rng=np.random.default_rng(0)) == greedy_accept(
            proposals, logits)
