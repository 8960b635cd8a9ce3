"""An answer's speculation counts, from the steps its engine reports."""

from inference.engines.speculation_stats import SpeculationStats
from inference.limits import Drafter


def test_speculation_counts_at_the_token_cap():
    stats = SpeculationStats(num_assistant_tokens=4, speculative=True, max_new_tokens=8)
    for n_tokens, at in ((1, 1.0), (5, 2.0), (2, 3.0)):  # prefill, 4 accepted + 1, then the cap leaves 2
        stats.add_step(n_tokens, at)
    summary = stats.summary(started_at=0.0, ended_at=3.0)
    assert summary.completion_tokens == 8 and summary.main_steps == 3
    assert summary.draft_tokens == 4 + 1  # with 2 tokens left the draft proposes 1: the main adds its own
    assert summary.accepted_tokens == 5 and summary.acceptance_rate == 1.0
    assert summary.accepted_by_position == [2, 1, 1, 1]
    assert summary.draft_steps == 2


def test_drafts_count_only_the_steps_that_verified_one_after_a_handover():
    """The Prometheus count of drafts: an answer the main alone began, then handed to the pair."""
    stats = SpeculationStats(num_assistant_tokens=None, speculative=False, max_new_tokens=64)
    for at in range(1, 6):  # a prefill and four plain steps
        stats.add_step(1, float(at))
    stats.hand_over(num_assistant_tokens=3, speculative=True)
    for n_tokens, at in ((1, 6.0), (4, 7.0), (2, 8.0)):  # a prefill again, then two verifying steps
        stats.add_step(n_tokens, at)
    summary = stats.summary(started_at=0.0, ended_at=8.0)
    assert summary.main_steps == 8 and summary.draft_steps == 2 and summary.accepted_tokens == 4


def test_each_drafters_proposals_and_acceptance_are_counted_apart():
    """The own engine says what proposed each step and how many tokens (the lookup proposes more than K)."""
    stats = SpeculationStats(num_assistant_tokens=3, speculative=True, max_new_tokens=64)
    steps = ((1, None, None), (4, Drafter.DRAFT, 3), (7, Drafter.NGRAM, 8), (1, Drafter.NGRAM, 8), (2, Drafter.DRAFT, 3))
    for at, (n_tokens, drafter, proposed) in enumerate(steps):
        stats.add_step(n_tokens, float(at), drafter=drafter, proposed=proposed)
    summary = stats.summary(started_at=0.0, ended_at=5.0)
    assert (summary.draft_tokens, summary.accepted_tokens, summary.draft_steps) == (22, 10, 4)
    assert (summary.ngram_draft_tokens, summary.ngram_accepted_tokens, summary.ngram_draft_steps) == (16, 6, 2)
    assert summary.accepted_by_position == [3, 2, 2, 1, 1, 1]
    library = SpeculationStats(num_assistant_tokens=3, speculative=True, max_new_tokens=64, drafter=Drafter.NGRAM)
    for at, n_tokens in enumerate((1, 4, 2)):  # the library's prompt lookup: its steps say nothing
        library.add_step(n_tokens, float(at))
    summary = library.summary(started_at=0.0, ended_at=3.0)
    assert (summary.ngram_draft_tokens, summary.ngram_accepted_tokens) == (summary.draft_tokens, 4) == (6, 4)



def test_steps_nothing_was_proposed_for_count_apart_from_the_drafts():
    """The own engine's steps where its drafters sat out (engines/own/payoff.py) are neither drafts nor rejections."""
    stats = SpeculationStats(num_assistant_tokens=3, speculative=True, max_new_tokens=64)
    steps = ((1, None, None), (1, Drafter.DRAFT, 0), (4, Drafter.DRAFT, 3), (1, Drafter.DRAFT, 0), (2, Drafter.NGRAM, 5))
    for at, (n_tokens, drafter, proposed) in enumerate(steps):
        stats.add_step(n_tokens, float(at), drafter=drafter, proposed=proposed)
    summary = stats.summary(started_at=0.0, ended_at=5.0)
    assert (summary.undrafted_steps, summary.draft_steps, summary.draft_tokens) == (2, 2, 8)
    assert summary.acceptance_rate == 4 / 8 and summary.mean_accepted_length == 8 / 4
