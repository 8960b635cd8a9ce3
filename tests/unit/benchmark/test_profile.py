"""The best K per load a profile stores, and the adaptive line's verdicts: ratios paired within a repeat."""

import pytest

from inference.benchmark.profile import adaptive_bars, best_k_by_level


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


def test_a_line_whose_answers_all_failed_is_unmeasured_not_a_crash_nor_a_verdict():
    bars = adaptive_bars({"greedy": [
        line("plain", [0.0, 0.0], {}),  # every burst's answers failed (the row counts them)
        line("K=5", [90.0, 92.0], {"K=5": 16}),
        line("adaptive", [96.0, 101.0], {"K=3": 16})]})
    assert [(b["verdict"], b["pass"], b["vs_plain"]) for b in bars] == [("unmeasured", False, None)]
    bars = adaptive_bars({"greedy": [  # adaptive's own answers failing is a miss, as before: 0x the main alone
        line("plain", [100.0, 100.0], {"plain": 16}),
        line("K=5", [90.0, 92.0], {"K=5": 16}),
        line("adaptive", [0.0, 0.0], {})]})
    assert [(b["verdict"], b["vs_plain"]) for b in bars] == [("miss", 0.0)]


def test_the_profile_takes_a_k_only_where_it_clearly_beats_the_main_alone():
    rows = [{"variant": v, "concurrency": c, "throughput": t} for v, c, t in [
        ("plain", 1, 25.0), ("K=3", 1, 66.0), ("K=5", 1, 84.0),
        ("plain", 16, 114.0), ("K=3", 16, 120.0), ("K=5", 16, 115.0),  # 5% faster: within one burst's noise
        ("plain", 4, 73.0), ("K=3", 4, 31.0), ("K=5", 4, 25.0)]]
    assert best_k_by_level(rows) == {"1": 5, "4": 0, "16": 0}
