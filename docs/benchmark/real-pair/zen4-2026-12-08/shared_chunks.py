"""Four ~1,572-token prompts at once (slices of engines/own/engine.py), the main alone, 64 new tokens each, in-process:
the own engine (bf16) with the chunk a long prompt reads a step beside answers (`Scheduler.shared_chunk_tokens`) set to
each size given, against the library's main alone (bf16), lines interleaved; the own engine's steps timed by what they
held (a prompt's chunk, answers' tokens). Issue 63's four-stream long line.

    DJANGO_DEBUG=1 .venv/bin/python docs/benchmark/real-pair/zen4-2026-12-08/shared_chunks.py 128,256 ROUNDS
"""

from __future__ import annotations

import itertools
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
django.setup()

from inference.engines.decoding import DecodingParams  # noqa: E402
from inference.engines.interface import Finished, StepTokens  # noqa: E402
from inference.engines.own.engine import OwnEngine  # noqa: E402
from inference.limits import Route  # noqa: E402
from inference.models import ModelPair  # noqa: E402
from inference.serving import precision  # noqa: E402
from inference.serving.host import this_host  # noqa: E402
from inference.serving.records import pair_spec  # noqa: E402
from inference.serving.registry import build_engine  # noqa: E402

FILE = Path("inference/engines/own/engine.py").read_text()
ANSWER_TOKENS = 9  # a step's work of at most this many tokens is an answer's (a token, a verify), more a chunk


def main() -> None:
    pair = ModelPair.objects.get(slug="qwen2.5-coder-1.5b")
    bf16 = precision.named("bf16").fields
    own = OwnEngine(replace(pair_spec(pair=pair, route=Route.OWN_SPECULATIVE), kv_pool_mb=2048, prefix_caching=False,
                            **bf16))
    library = build_engine(replace(pair_spec(pair=pair, route=Route.LIBRARY_MAIN_ALONE), prefix_caching=False, **bf16))
    encode = own.tokenizer.encode
    prompts = [encode(FILE[i * 400:i * 400 + 6500] + "\nSummarise this code.\n").input_ids.data[0].tolist()
               for i in range(4)]
    print(this_host().described, [len(prompt) for prompt in prompts], flush=True)
    steps: list[tuple[int, int, float]] = []  # (chunk tokens, answers, seconds)
    run = own.main.runner.run

    def timed_run(works, **options):
        began = time.perf_counter()
        out = run(works, **options)
        sizes = [len(work.tokens) for work in works]
        chunk = sum(n for n in sizes if n > ANSWER_TOKENS)
        steps.append((chunk, len(sizes) - sum(n > ANSWER_TOKENS for n in sizes), time.perf_counter() - began))
        return out

    own.main.runner.run = timed_run
    sizes = [int(size) for size in sys.argv[1].split(",")]
    rates: dict[str, list[float]] = {}
    for index in range(int(sys.argv[2])):
        for line in [*map(str, sizes), "library"]:
            engine = library if line == "library" else own
            if line != "library":
                own.main.scheduler.shared_chunk_tokens = int(line)
            rate, firsts, gap = four_at_once(engine, prompts)
            rates.setdefault(line, []).append(rate)
            if line != "library":
                print_steps(steps)
            steps.clear()
            print(f"round {index} {line}: {rate:.2f} tok/s, first tokens {firsts}, longest gap {gap:.2f} s",
                  flush=True)
    library_rate = statistics.median(rates["library"])
    for line, values in rates.items():
        median = statistics.median(values)
        print(f"{line}: median {median:.2f} = {median / library_rate:.3f}x library")


def four_at_once(engine, prompts: list[list[int]]) -> tuple[float, list[float], float]:
    """Tokens/s over the whole answers, their first tokens (s, sorted), the longest gap between two tokens of one."""
    began = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        done = list(pool.map(lambda ids: answer(engine, ids), prompts))
    total = time.perf_counter() - began
    gap = max(max(b - a for a, b in itertools.pairwise(stamps)) for _, stamps in done)
    firsts = sorted(round(stamps[0] - added, 1) for added, stamps in done)
    return sum(len(stamps) for _, stamps in done) / total, firsts, gap


def answer(engine, ids: list[int]) -> tuple[float, list[float]]:
    request = engine.submit(prompt_ids=ids, params=DecodingParams(max_new_tokens=64, ignore_eos=True))
    stamps: list[float] = []
    while not isinstance(event := request.events.get(timeout=600), Finished):
        if isinstance(event, StepTokens):
            stamps += [time.perf_counter()] * len(event.token_ids)
    return request.added_at, stamps


def print_steps(steps: list[tuple[int, int, float]]) -> None:
    kinds: dict[tuple[int, int], list[float]] = {}
    for chunk, answers, seconds in steps:
        kinds.setdefault((chunk, answers), []).append(seconds)
    for (chunk, answers), seconds in sorted(kinds.items()):
        median = statistics.median(seconds) * 1000
        print(f"   chunk {chunk} answers {answers}: {len(seconds)} steps, median {median:.0f} ms, "
              f"max {max(seconds) * 1000:.0f}")


if __name__ == "__main__":
    main()
