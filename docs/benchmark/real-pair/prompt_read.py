"""Where the own engine's main alone loses to the library's after a long prompt: the prompt's read. A ~1,574-token
prompt (random tokens), prefix caches off, interleaved rounds:

1. the first token and 32 tokens on the own engine's main alone against the library's (openvino-genai's
   ContinuousBatchingPipeline in its step process, reading the whole prompt in one step);
2. the own engine's read in chunks of 256, 512 and 1,024 tokens and whole (its scheduler's chunk).

    DJANGO_DEBUG=1 .venv/bin/python docs/benchmark/real-pair/prompt_read.py [PAIR [OWN_CONFIG [LIBRARY_CONFIG]]]

CONFIGs are serving/precision.py's names, bf16 by default (the own engine's with bf16 blocks, as it compiles it):
give each engine the configuration the host's calibration serves it in.
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

from inference.engines.decoding import DecodingParams  # noqa: E402
from inference.engines.interface import Engine, Finished, StepTokens  # noqa: E402
from inference.engines.own.engine import OwnEngine  # noqa: E402
from inference.limits import Route  # noqa: E402
from inference.models import ModelPair  # noqa: E402
from inference.serving import precision  # noqa: E402
from inference.serving.host import this_host  # noqa: E402
from inference.serving.records import pair_spec  # noqa: E402
from inference.serving.registry import build_engine  # noqa: E402

PROMPT_TOKENS, ROUNDS = 1574, 3


def first_and_whole(engine: Engine, prompt_ids: list[int], tokens: int = 32) -> tuple[float, float]:
    request = engine.submit(prompt_ids=prompt_ids, params=DecodingParams(max_new_tokens=tokens, ignore_eos=True))
    began, first = time.perf_counter(), None
    while not isinstance(event := request.events.get(timeout=600), Finished):
        if isinstance(event, StepTokens):
            first = first or time.perf_counter()
    assert first is not None
    return first - began, time.perf_counter() - began


def main() -> None:
    args = sys.argv[1:]
    slug = args[0] if args else "qwen2.5-coder-1.5b"
    own_config, library_config = (args[1] if len(args) > 1 else "bf16"), (args[2] if len(args) > 2 else "bf16")
    pair = ModelPair.objects.get(slug=slug)
    own = OwnEngine(replace(pair_spec(pair=pair, route=Route.OWN_SPECULATIVE), kv_pool_mb=1024,
                            prefix_caching=False, **precision.CONFIGS[own_config].fields))
    library = build_engine(replace(pair_spec(pair=pair, route=Route.LIBRARY_MAIN_ALONE), prefix_caching=False,
                                   **precision.CONFIGS[library_config].fields))
    print(f"host: {this_host().described}; own engine {own_config} (its main rows: {own.main.runner.steady}), "
          f"library {library_config}")
    rng = np.random.default_rng(0)
    timed: dict[str, list[tuple[float, float]]] = {"own": [], "library": []}
    chunks: dict[int, list[float]] = {}
    scheduler = own.main.scheduler
    kept = scheduler.chunk_tokens, scheduler.step_tokens
    for _ in range(ROUNDS):
        prompt = rng.integers(100, 30000, PROMPT_TOKENS).tolist()
        timed["own"].append(first_and_whole(own, prompt))
        timed["library"].append(first_and_whole(library, prompt))
        for chunk in (256, 512, 1024, PROMPT_TOKENS):
            scheduler.chunk_tokens, scheduler.step_tokens = chunk, 2 * chunk
            sequence = own.main.sequence(exact=True)
            began = time.perf_counter()
            sequence.prefill(prompt)
            chunks.setdefault(chunk, []).append(time.perf_counter() - began)
            sequence.close()
        scheduler.chunk_tokens, scheduler.step_tokens = kept
    for name, runs in timed.items():
        print(f"{name}: first token {statistics.median(r[0] for r in runs):.2f} s, 32 tokens "
              f"{statistics.median(r[1] for r in runs):.2f} s (medians of {ROUNDS})")
    print("own engine's read in chunks of " + ", ".join(f"{chunk}: {statistics.median(seconds):.2f} s"
                                                       for chunk, seconds in chunks.items()))
    own.close()
    library.close()


if __name__ == "__main__":
    main()
