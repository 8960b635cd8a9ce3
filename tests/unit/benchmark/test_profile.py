"""The adaptive line's verdicts: ratios paired within a repeat, and the path each answer was served on."""

import pytest

from inference.benchmark.profile import adaptive_bars
from inference.benchmark.stack import served_path


def line(variant: str, by_repeat: list[float], paths: dict[str, int]) -> dict:
    return {"variant": variant, "concurrency": 8, "throughput": sorted(by_repeat)[len(by_repeat) // 2],
            "throughput_by_repeat": by_repeat, "paths": paths}


def test_ratios_pair_bursts_of_one_repeat_so_the_hosts_drift_between_repeats_cancels():
    # the host slows by half in the third repeat: adaptive ran K=3 there too, and stays 1.2x the main alone
    bars = adaptive_bars({"greedy": [
        line("plain", [100.0, 100.0, 50.0], {"plain": 24}),
        line("K=5", [110.0, 110.0, 55.0], {"K=5": 24}),
        line("adaptive", [120.0, 120.0, 60.0], {"K=3": 24})]})
    assert [(b["verdict"], round(b["vs_plain"], 2), b["vs_plain_range"]) for b in bars] == [
        ("pass", 1.2, [pytest.approx(1.2), pytest.approx(1.2)])]


@pytest.mark.parametrize(("adaptive_paths", "verdict"), [
    ({"plain": 24}, "same path"),  # adaptive served the main alone itself: two runs of one path
    ({"plain": 20, "K=5": 4}, "miss"),  # a path of its own, and slower
    ({"moved to plain": 24}, "miss"),  # answers that moved paid a second prefill: not the same path
])
def test_a_cell_short_of_the_main_alone_is_a_miss_unless_adaptive_served_the_main_alone_itself(adaptive_paths, verdict):
    bars = adaptive_bars({"greedy": [
        line("plain", [100.0, 104.0, 98.0], {"plain": 24}),
        line("K=5", [90.0, 92.0, 91.0], {"K=5": 24}),
        line("adaptive", [96.0, 101.0, 95.0], adaptive_paths)]})
    assert bars[0]["verdict"] == verdict and not bars[0]["pass"]


@pytest.mark.parametrize(("usage", "path"), [
    ({"speculative_mode": "off", "speculative_k": None, "speculative_reason_codes": ["asked-off"]}, "plain"),
    ({"speculative_mode": "draft", "speculative_k": 3, "speculative_reason_codes": ["profile-best-k"]}, "K=3"),
    ({"speculative_mode": "draft-exact-sampling", "speculative_k": 2, "speculative_reason_codes": []}, "K=2"),
    ({"speculative_mode": "off", "speculative_k": None,
      "speculative_reason_codes": ["profile-best-k", "handed-over"]}, "moved to plain"),
    ({"speculative_mode": "draft", "speculative_k": None, "speculative_reason_codes": ["threshold-asked"]}, "draft"),
])
def test_the_path_an_answer_was_served_on_is_named_as_the_benchmarks_lines(usage, path):
    assert served_path(usage) == path
