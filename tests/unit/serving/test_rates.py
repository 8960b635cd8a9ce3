"""A worker's live figures: tokens/s per K and load, and the load a request plans for."""

import pytest

from inference.serving.rates import StepRates, streams_bucket


def test_recent_figures_count_by_the_streams_a_step_served_and_fade():
    rates = StepRates(fresh_s=60, min_step_seconds=0.9)
    assert [streams_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 16)] == [1, 2, 4, 4, 8, 8, 16, 16]
    for step in range(10):
        rates.record(k=0, streams=8, tokens=8, seconds=0.1, at=step)  # 80 tok/s over 1 s of steps
        rates.record(k=5, streams=7, tokens=14, seconds=0.2, at=step)  # 70 tok/s over 2 s
        rates.record(k=5, streams=1, tokens=3, seconds=0.05, at=step)  # 0.5 s: too little to say
    assert rates.at_load(8, now=10) == pytest.approx({0: 80.0, 5: 70.0})
    assert rates.at_load(1, now=10) == {}
    assert rates.at_load(8, now=65) == pytest.approx({5: 70.0})  # the first 5 s of samples have faded
    assert rates.at_load(8, now=200) == {}


def test_the_load_a_request_plans_for_remembers_the_last_seconds_unless_live_figures_are_off():
    rates, off = StepRates(fresh_s=60, min_step_seconds=1.0), StepRates(fresh_s=0, min_step_seconds=1.0)
    for load in (16, 3):
        rates.note_load(load)
        off.note_load(load)
        off.record(k=0, streams=load, tokens=load, seconds=5.0)
    assert rates.recent_peak(within_s=5) == 16 and off.recent_peak(within_s=5) == 0
    assert rates.recent_peak(within_s=0) == 0
    assert off.at_load(16) == {}
