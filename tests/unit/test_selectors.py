"""A pair's serving state, read from its workers' heartbeats."""

from inference import limits
from inference.models import ModelPair
from inference.selectors import pair_state


def test_pair_state_from_heartbeats():
    pair = ModelPair(slug="p", main_dir="m", enabled=True)
    beat = {"name": "w1", "queues": ["pair.p"], "pairs": {}}
    assert pair_state(pair=pair, workers=[]).state == limits.ServingState.UNAVAILABLE
    assert pair_state(pair=pair, workers=[beat]).state == limits.ServingState.LOADING
    available = {**beat, "name": "w2", "pairs": {"p": {"state": "available", "error": ""}}}
    assert pair_state(pair=pair, workers=[beat, available]).state == limits.ServingState.AVAILABLE
    failed = {**beat, "pairs": {"p": {"state": "failed", "error": "no file"}}}
    state = pair_state(pair=pair, workers=[failed])
    assert state.state == limits.ServingState.UNAVAILABLE and not state.served
    assert "no file" in state.detail and "no file" not in state.error  # the worker's words are the admin's only
    pair.enabled = False
    assert "disabled" in pair_state(pair=pair, workers=[available]).error
