"""An answer's speculation counts, from the steps its engine reports."""

from inference.engines.speculation_stats import SpeculationStats


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
