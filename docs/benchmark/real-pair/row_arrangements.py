"""What one inference of the real main costs in each arrangement of its rows the PagedAttention op offers, medians
in ms, the arrangements interleaved: a lone token, the main alone's 2-token query (the previous token re-fed, as the
engine runs it: engines/own/kv_cache.py), a verify of 8 as one sequence, and the same at four streams or as one-token
sequences sharing a block table (the other exact arrangement, docs/exactness.md#one-kernel-path).

    DJANGO_DEBUG=1 CONTEXT=2000 .venv/bin/python docs/benchmark/real-pair/row_arrangements.py [CONFIG]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import replace

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
django.setup()

import numpy as np  # noqa: E402
import openvino as ov  # noqa: E402

from inference.benchmark.modes import measuring_model  # noqa: E402
from inference.engines.own.engine import own_engine_precision  # noqa: E402
from inference.engines.own.model_runner import Work  # noqa: E402
from inference.engines.own.paged_model import read_paged  # noqa: E402
from inference.limits import Route  # noqa: E402
from inference.models import ModelPair  # noqa: E402
from inference.serving import precision  # noqa: E402
from inference.serving.records import pair_spec  # noqa: E402

CONTEXT = int(os.environ.get("CONTEXT", "64"))
REPEATS = int(os.environ.get("REPEATS", "10"))


def main() -> None:
    config = sys.argv[1] if len(sys.argv) > 1 else "f32-dynamic"
    pair = ModelPair.objects.get(slug="qwen2.5-coder-1.5b")
    spec = own_engine_precision(replace(pair_spec(pair=pair, route=Route.OWN_SPECULATIVE),
                                        **precision.CONFIGS[config].fields))
    props = spec.device_properties(device="CPU")
    core = ov.Core()
    model = measuring_model(core.compile_model(read_paged(core, spec.main_dir), "CPU", props),
                            main_dir=spec.main_dir, properties=props)
    rng = np.random.default_rng(0)
    sequences = [model.sequence(exact=True) for _ in range(4)]
    for sequence in sequences:
        sequence.prefill(rng.integers(100, 20_000, size=CONTEXT).tolist())
        sequence.reserve(CONTEXT + 16)

    def tokens(n: int) -> list[int]:
        return rng.integers(100, 20_000, size=n).tolist()

    def arrangements() -> dict[str, list[Work]]:
        one = sequences[0]
        return {  # each taken back at once (nothing is kept: the slots are written over)
            "1 sequence, 1 token": [Work(one.block_table, one.position, tokens(1))],
            "1 sequence, a 2-token query": [Work(one.block_table, one.position - 1, tokens(2))],
            "1 sequence, a verify of 8": [Work(one.block_table, one.position, tokens(8), 8)],
            "4 sequences, 1 token each": [Work(s.block_table, s.position, tokens(1)) for s in sequences],
            "4 sequences, a 2-token query each": [Work(s.block_table, s.position - 1, tokens(2)) for s in sequences],
            "a verify of 8 as one-token sequences on one table":
                [Work(one.block_table, one.position + index, tokens(1)) for index in range(8)],
        }

    seconds: dict[str, list[float]] = {name: [] for name in arrangements()}
    for _ in range(REPEATS):
        for name, works in arrangements().items():
            began = time.perf_counter()
            model.runner.run(works)
            seconds[name].append(time.perf_counter() - began)
    print(f"{config}, after {CONTEXT} tokens of context, medians of {REPEATS}:")
    for name, each in seconds.items():
        print(f"| {name} | {statistics.median(each) * 1000:.1f} ms |")


if __name__ == "__main__":
    main()
