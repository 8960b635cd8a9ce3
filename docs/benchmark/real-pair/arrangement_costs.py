"""What one inference of the real main costs in each exact arrangement of its rows (engines/own/model_runner.py):
queries (Q) and one-token sequences (T), after 256 and 2,000 tokens of context: a lone answer's token, four answers'
tokens at once, a verify of 3, 5 and 9, a prompt's chunk of 64. Milliseconds, medians of 7 interleaved rounds (a
first one not counted), the runner called directly on blocks of the pool (what they hold does not change the cost).

    DJANGO_DEBUG=1 .venv/bin/python docs/benchmark/real-pair/arrangement_costs.py [main folder] [f32|bf16]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
django.setup()

import openvino as ov  # noqa: E402

from inference.engines.own.model_runner import ModelRunner, Steady, Work  # noqa: E402
from inference.engines.own.paged_model import read_paged  # noqa: E402

ROUNDS = 8


def main() -> None:
    main_dir = sys.argv[1] if len(sys.argv) > 1 else "inference/models/qwen2.5-coder-1.5b/main"
    precision = sys.argv[2] if len(sys.argv) > 2 else "f32"
    core = ov.Core()
    runner = ModelRunner(core.compile_model(read_paged(core, main_dir), "CPU",
                                            {"INFERENCE_PRECISION_HINT": precision, "KV_CACHE_PRECISION": precision}),
                         pool_bytes=512 * 2**20)
    arrangements = {"Q": Steady(), "T": Steady(token_rows=True)}
    for context in (256, 2000):
        per_answer = -(-(context + 80) // runner.block_tokens)
        blocks = runner.pool.allocate(4 * per_answer)
        tables = [blocks[i * per_answer:(i + 1) * per_answer] for i in range(4)]

        def steps(token_rows: bool, context: int = context, tables: list = tables) -> dict[str, list[Work]]:
            one = [9] if token_rows else [9, 9]  # a token, or a query re-feeding the one before it
            start = context - len(one) + 1
            return {"a lone token": [Work(tables[0], start, one, 1, token_rows)],
                    "four answers' tokens": [Work(table, start, one, 1, token_rows) for table in tables],
                    **{f"a verify of {n}": [Work(tables[0], context, [9] * n, n, token_rows)] for n in (3, 5, 9)},
                    "a prompt's chunk of 64": [Work(tables[0], context, [9] * 64, 1, token_rows)]}

        seconds: dict[tuple[str, str], list[float]] = {}
        for round_ in range(ROUNDS):
            for name, steady in arrangements.items():
                runner.steady = steady
                for step, works in steps(steady.token_rows).items():
                    began = time.perf_counter()
                    runner.run(works)
                    if round_:
                        seconds.setdefault((name, step), []).append(time.perf_counter() - began)
        print(f"after {context} tokens ({precision}):")
        for step in steps(False):
            q, t = (statistics.median(seconds[(name, step)]) * 1000 for name in arrangements)
            print(f"  {step:24} Q {q:6.1f} ms  T {t:6.1f} ms  T/Q {t / q:.2f}")
        runner.pool.release(blocks)


if __name__ == "__main__":
    main()
