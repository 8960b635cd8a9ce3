"""The own engine's top_p ranks a head of the vocabulary instead of sorting it all: the set it keeps
must be the full sort's, token for token, or sampled answers would leave the main's distribution."""

import numpy as np
import pytest

from inference.engines.own.acceptance import nucleus


def full_sort_nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    order = np.argsort(-probs, kind="stable")
    mass = np.cumsum(probs[order])
    return order[: min(int(np.searchsorted(mass, top_p, side="right")) + 1, len(order))]


def distributions(rng: np.random.Generator):
    vocab = 4000
    peaked = np.exp(rng.standard_normal(vocab) * 4)  # most mass on a few tokens: the head suffices
    flat = np.ones(vocab) + rng.random(vocab) * 1e-3  # mass spread out: the head falls short
    tied = np.repeat(rng.random(vocab // 8), 8)  # ties at every rank, the head's floor among them
    for probs in (peaked, flat, tied):
        yield probs / probs.sum()


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.95, 0.999999])
@pytest.mark.parametrize("candidates", [1, 16, 100, 5000])
def test_the_nucleus_is_the_full_sorts_token_for_token(top_p, candidates):
    for probs in distributions(np.random.default_rng(7)):
        assert np.array_equal(nucleus(probs, top_p, candidates=candidates), full_sort_nucleus(probs, top_p))
