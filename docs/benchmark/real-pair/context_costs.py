"""What the own engine's main costs a step after a short and a long context, on the real pair, medians of 8: one token
on a cache no cut has touched, a verify of 7 (K=6), cutting 3 rejected tokens from its cache
(engines/own/kv_cache.py, KvSequence.drop_last: reading the state, writing it back shorter), and the first token after
a cut (the plugin grows the state it was handed back, a copy of the whole cache again); the draft's token beside.

    DJANGO_DEBUG=1 .venv/bin/python docs/benchmark/real-pair/context_costs.py
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
django.setup()

import numpy as np  # noqa: E402

from inference.engines.own.engine import OwnEngine  # noqa: E402
from inference.engines.own.kv_cache import KvSequence  # noqa: E402
from inference.limits import Route  # noqa: E402
from inference.models import ModelPair  # noqa: E402
from inference.serving.host import this_host  # noqa: E402
from inference.serving.records import pair_spec  # noqa: E402

ROUNDS = 8


def timed(step: Callable[[], object]) -> float:
    began = time.perf_counter()
    step()
    return time.perf_counter() - began


def ms(seconds: list[float]) -> str:
    return f"{statistics.median(seconds) * 1000:.0f} ms"


def costs(engine: OwnEngine, prompt: list[int]) -> str:
    main, draft = KvSequence(engine.main, cut_rejected=True), engine.draft_sequence()
    main.prefill(prompt)
    draft.prefill(prompt)
    one = [timed(lambda: main.feed([5])) for _ in range(ROUNDS)]
    drafted = [timed(lambda: draft.feed([5])) for _ in range(ROUNDS)]
    verify, cut, after_cut = [], [], []
    for _ in range(ROUNDS):
        verify.append(timed(lambda: main.feed([5, 6, 7, 8, 9, 10, 11])))
        cut.append(timed(lambda: main.drop_last(3)))
        after_cut.append(timed(lambda: main.feed([5])))
    main.close()
    draft.close()
    return (f"one token {ms(one)}, a verify of 7 {ms(verify)}, cutting 3 {ms(cut)}, one token after the cut "
            f"{ms(after_cut)}; a draft token {ms(drafted)}")


def main() -> None:
    pair = ModelPair.objects.get(slug="qwen2.5-coder-1.5b")
    engine = OwnEngine(pair_spec(pair=pair, route=Route.OWN_SPECULATIVE))
    rng = np.random.default_rng(0)
    print(f"host: {this_host().described}")
    for context in (50, 1000, 2000):
        print(f"after {context} tokens: {costs(engine, rng.integers(100, 30000, context).tolist())}", flush=True)


if __name__ == "__main__":
    main()
