"""A long answer that a short one overlaps for a moment, on the own engine, in-process (the real pair, bf16, one
speculating stream, as the calibration sets it on a 2-vCPU host): the long answer's tokens/s after its first token
when it stays in the batch to its end (as before 2026-12-08) and when it leaves the batch once the short one has
ended (`Decoding._leave_batch_once_alone`). Two held-out chat prompts, 256 tokens each (EOS ignored), the short answer
(12 tokens) sent once the long one has written 16; two rounds, the lines interleaved.

    DJANGO_DEBUG=1 .venv/bin/python docs/benchmark/real-pair/batch_leave.py [K]
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from dataclasses import replace

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
django.setup()

from inference.engines.decoding import DecodingParams, Speculation  # noqa: E402
from inference.engines.interface import Finished, StepTokens  # noqa: E402
from inference.engines.own import engine as own_engine  # noqa: E402
from inference.engines.own.engine import OwnEngine  # noqa: E402
from inference.limits import Route  # noqa: E402
from inference.models import ModelPair  # noqa: E402
from inference.serving import precision  # noqa: E402
from inference.serving.host import this_host  # noqa: E402
from inference.serving.records import pair_spec  # noqa: E402

LONG = (("Write a Python class for an LRU cache with get, put, delete and resize methods, with docstrings and type "
         "hints, then unit tests for it."),
        "Explain how Python's asyncio event loop schedules coroutines, with three code examples.")
SHORT = "What is 2+2? One word."


def main() -> None:
    pair = ModelPair.objects.get(slug="qwen2.5-coder-1.5b")
    spec = replace(pair_spec(pair=pair, route=Route.OWN_SPECULATIVE), kv_pool_mb=2048, speculating_streams=1,
                   **precision.named("bf16").fields)
    engine = OwnEngine(spec)

    def chat(text: str) -> list[int]:
        return engine.tokenizer.encode(f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                                       f"{text}<|im_end|>\n<|im_start|>assistant\n").input_ids.data[0].tolist()

    def drain(request) -> None:
        while not isinstance(request.events.get(timeout=600), Finished):
            pass

    def overlapped(prompt: list[int], k: int) -> tuple[float, list[str]]:
        """The long answer's tokens/s after its first token, and what the engine said on the way."""
        request = engine.submit(prompt_ids=prompt, params=DecodingParams(max_new_tokens=256, ignore_eos=True,
                                                                         speculation=Speculation(k=k)))
        stamps: list[float] = []
        said = []
        while not isinstance(event := request.events.get(timeout=600), Finished):
            if not isinstance(event, StepTokens):
                said.append(f"{type(event).__name__} at token {event.token}")
                continue
            stamps += [time.perf_counter()] * len(event.token_ids)
            if len(stamps) >= 16 and len(stamps) - len(event.token_ids) < 16:
                short = engine.submit(prompt_ids=chat(SHORT), params=DecodingParams(max_new_tokens=12,
                                                                                   ignore_eos=True))
                threading.Thread(target=drain, args=(short,), daemon=True).start()
        return (len(stamps) - 1) / (stamps[-1] - stamps[0]), said

    k = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print(f"host: {this_host().described}; K={k}")
    rates: dict[str, list[float]] = {"stays in the batch": [], "leaves it": []}
    for index in range(2):
        for line, measured in rates.items():
            own_engine.LEAVE_BATCH_AFTER_S = 1e9 if line == "stays in the batch" else 1.0
            for text in LONG:
                rate, said = overlapped(chat(text), k)
                measured.append(rate)
                print(f"round {index}, {line}: {rate:.1f} tok/s after the first token; {', '.join(said)}", flush=True)
    medians = {line: statistics.median(values) for line, values in rates.items()}
    print("; ".join(f"{line}: median {rate:.1f} tok/s" for line, rate in medians.items())
          + f"; leaves / stays {medians['leaves it'] / medians['stays in the batch']:.2f}x")
    engine.close()


if __name__ == "__main__":
    main()
