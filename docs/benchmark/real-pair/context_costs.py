"""What the own engine's main costs a step after a short and a long context, on the real pair: one token, a verify of
5, and cutting 3 rejected tokens from its cache (engines/own/kv_cache.py, KvSequence.drop_last), medians of 8.

    DJANGO_DEBUG=1 .venv/bin/python docs/benchmark/real-pair/context_costs.py
"""

from __future__ import annotations

import os
import statistics
import time

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


def ms(seconds: list[float]) -> str:
    return f"{statistics.median(seconds) * 1000:.0f} ms"


def main() -> None:
    pair = ModelPair.objects.get(slug="qwen2.5-coder-1.5b")
    engine = OwnEngine(pair_spec(pair=pair, route=Route.OWN_SPECULATIVE))
    rng = np.random.default_rng(0)
    print(f"host: {this_host().described}")
    for context in (50, 1000, 2000):
        sequence = KvSequence(engine.main, cut_rejected=True)
        sequence.prefill(rng.integers(100, 30000, context).tolist())
        one, verify, cut = [], [], []
        for _ in range(8):
            began = time.perf_counter()
            sequence.feed([5])
            one.append(time.perf_counter() - began)
            began = time.perf_counter()
            sequence.feed([5, 6, 7, 8, 9])
            verify.append(time.perf_counter() - began)
            began = time.perf_counter()
            sequence.drop_last(3)
            cut.append(time.perf_counter() - began)
        print(f"after {context} tokens: one token {ms(one)}, a verify of 5 {ms(verify)}, cutting 3 {ms(cut)}",
              flush=True)


if __name__ == "__main__":
    main()
