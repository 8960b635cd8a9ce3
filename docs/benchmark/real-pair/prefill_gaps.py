"""How long one stream waits between two tokens while another user's long prompt is read, on the own engine
(engines/own/prefix_cache.py): the prompt read whole in one inference (before the prefix cache) against read in chunks
of BLOCK_TOKENS, between which the other stream's steps take their turn on the cores.

Stream A answers a short chat request (greedy, as it ships: K from the host's calibration, else 4); two seconds in,
stream B sends a ~2,000-token prompt (a pasted file of the standard library, nobody tuned on it). Printed per arm and
repeat: A's longest gap between tokens while B's prompt is read, A's median gap, and B's time to first token.

    DJANGO_DEBUG=1 .venv/bin/python docs/benchmark/real-pair/prefill_gaps.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import threading
import time
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
django.setup()

from inference.engines.decoding import DecodingParams  # noqa: E402
from inference.engines.interface import Finished, StepTokens  # noqa: E402
from inference.engines.own.engine import OwnEngine  # noqa: E402
from inference.limits import Route  # noqa: E402
from inference.models import ModelPair  # noqa: E402
from inference.serving.calibrated import host_figures  # noqa: E402
from inference.serving.host import this_host  # noqa: E402
from inference.serving.records import pair_spec  # noqa: E402

WHOLE = 1 << 20  # a block longer than any prompt: read in one inference, as before the prefix cache


def long_prompt(engine: OwnEngine, tokens: int) -> list[int]:
    source = Path(os.__file__).with_name("argparse.py").read_text()
    ids = engine.tokenizer.encode(f"Review this file:\n```python\n{source}").input_ids.data[0].tolist()
    return ids[:tokens]


def run_arm(engine: OwnEngine, *, block: int, k: int, prompt_b: list[int]) -> tuple[float, float, float]:
    """(A's longest gap while B is read, A's median gap, B's time to first token), seconds."""
    engine.main_prompts.block_tokens = engine.draft_prompts.block_tokens = block
    a_ids = engine.tokenizer.encode("Write a Python function that merges two sorted lists, with a docstring."
                                    ).input_ids.data[0].tolist()
    stamps: list[float] = []
    b_sent: list[float] = []
    b_first: list[float] = []

    def stream_a() -> None:
        request = engine.submit(prompt_ids=a_ids, params=DecodingParams(max_new_tokens=160, ignore_eos=True,
                                                                       num_assistant_tokens=k))
        while not isinstance(event := request.next_step(timeout=600), Finished):
            if isinstance(event, StepTokens):
                stamps.append(event.at)

    def stream_b() -> None:
        time.sleep(2.0)
        b_sent.append(time.perf_counter())
        request = engine.submit(prompt_ids=prompt_b, params=DecodingParams(max_new_tokens=4, ignore_eos=True,
                                                                          num_assistant_tokens=k))
        while not isinstance(event := request.next_step(timeout=600), Finished):
            if isinstance(event, StepTokens) and not b_first:
                b_first.append(event.at)

    threads = [threading.Thread(target=stream_a), threading.Thread(target=stream_b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gaps = [(later - earlier, later) for earlier, later in itertools.pairwise(stamps)]
    during = [gap for gap, at in gaps if b_sent[0] <= at <= b_first[0] + 1.0] or [0.0]
    return max(during), statistics.median(gap for gap, _ in gaps), b_first[0] - b_sent[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    args = parser.parse_args()
    pair = ModelPair.objects.get(slug="qwen2.5-coder-1.5b")
    figures = host_figures(pair=pair, host=this_host(pair.runs_on))
    engine = OwnEngine(pair_spec(pair=pair, route=Route.OWN_SPECULATIVE, calibration=figures))
    k = figures.best_k.get(1, 4) if figures.calibrated else 4
    prompt_b = long_prompt(engine, args.prompt_tokens)
    print(f"host: {this_host().described}; stream A at K={k}; B's prompt {len(prompt_b)} tokens; prefix cache off "
          "for B's prompt (it differs each repeat)")
    for repeat in range(args.repeats):
        for name, block in (("whole prompt in one inference", WHOLE), ("chunks of 64 tokens", 64)):
            engine.main_prompts.capacity_bytes = engine.draft_prompts.capacity_bytes = 0  # every repeat reads it all
            longest, median_gap, ttft = run_arm(engine, block=block, k=k, prompt_b=prompt_b[repeat:])
            print(f"repeat {repeat}, {name}: A's longest gap while B is read {longest:.2f} s "
                  f"(median gap {median_gap:.2f} s); B's first token after {ttft:.1f} s", flush=True)


if __name__ == "__main__":
    main()
