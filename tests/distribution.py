"""A distribution test any decoding path can be put through (after vLLM's rejection-sampler test):
many seeded samples of short continuations from the path under test and from the main model alone,
compared per position and on the joint of the first two tokens by a permutation test on the total
variation distance. Its false-alarm rate is the significance level (the permutation p-value is exact
up to Monte Carlo error); seeds are fixed, so a run gives the same verdict every time."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

Continuation = tuple[int, ...]
Sampler = Callable[[int], Continuation]  # seed -> the first new tokens of one answer
ALPHA = 1e-3  # per comparison; a handful of comparisons per path keeps the family-wise rate under 1%


def samples(sampler: Sampler, seeds: Sequence[int], *, threads: int = 4) -> list[Continuation]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(sampler, seeds))


def total_variation(a: Sequence, b: Sequence) -> float:
    ca, cb = Counter(a), Counter(b)
    return 0.5 * sum(abs(ca[x] / len(a) - cb[x] / len(b)) for x in ca.keys() | cb.keys())


def permutation_p_value(a: Sequence, b: Sequence, *, permutations: int = 2000, seed: int = 0) -> float:
    """P(TV of a random split of the pooled samples >= the observed TV): small when a and b differ."""
    _, codes = np.unique(np.array([repr(x) for x in [*a, *b]]), return_inverse=True)
    bins = codes.max() + 1

    def tv(order: np.ndarray) -> float:
        left = np.bincount(order[: len(a)], minlength=bins) / len(a)
        right = np.bincount(order[len(a):], minlength=bins) / len(b)
        return 0.5 * float(np.abs(left - right).sum())

    observed = tv(codes)
    rng = np.random.default_rng(seed)
    at_least = sum(tv(rng.permutation(codes)) >= observed - 1e-12 for _ in range(permutations))
    return (at_least + 1) / (permutations + 1)


def compare(tested: list[Continuation], reference: list[Continuation], *, positions: int = 3) -> dict[str, dict]:
    """TV and p-value per token position, and for the joint of the first two tokens."""
    views = {f"position {i}": (lambda s, i=i: s[i]) for i in range(positions)}
    views["first two"] = lambda s: s[:2]
    report = {}
    for name, view in views.items():
        a, b = [view(s) for s in tested], [view(s) for s in reference]
        report[name] = {"tv": total_variation(a, b), "p": permutation_p_value(a, b)}
    return report


def differs(report: dict[str, dict]) -> list[str]:
    return [f"{name}: TV {r['tv']:.3f}, p {r['p']:.4f}" for name, r in report.items() if r["p"] < ALPHA]
