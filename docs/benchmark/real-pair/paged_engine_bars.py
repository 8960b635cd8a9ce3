"""The bars of the own engine on the PagedAttention op, on the real pair, in-process, every line interleaved:

1. what a step costs after 50, 1,000 and 2,000 tokens of context: the main alone's token, a verify of 7 (K=6), taking
   back 3 rejected tokens (engines/own/kv_cache.py, PagedSequence.drop_last), the token after that, a draft token;
2. the first token of a follow-up after a cached ~2,000-token conversation, against the same prompt read cold by
   another user (whose scope finds none of it: engines/own/block_pool.py);
3. the engine's main alone against the library's (openvino-genai's ContinuousBatchingPipeline, in each precision
   configuration the host offers, the fastest kept), after 50 and ~2,000 prompt tokens, at 1 and 4 streams: tokens/s
   over whole answers (first token included), greedy, 64 new tokens; and whether the engine's answers with the draft
   are the main alone's.

    DJANGO_DEBUG=1 .venv/bin/python docs/benchmark/real-pair/paged_engine_bars.py [CONFIG ...]

CONFIGs (serving/precision.py's names) narrow the library's lines to those, e.g. the fastest the host's calibration
found; the own engine's configuration for the follow-up, K=4 and identity is the one whose token costs least here.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
django.setup()

import numpy as np  # noqa: E402
import openvino as ov  # noqa: E402

from inference.calibration.measure import chat_prompts  # noqa: E402
from inference.engines.decoding import DecodingParams, Speculation  # noqa: E402
from inference.engines.interface import Engine, Finished, StepTokens  # noqa: E402
from inference.engines.own.engine import OwnEngine  # noqa: E402
from inference.limits import Route  # noqa: E402
from inference.models import ModelPair  # noqa: E402
from inference.serving import precision  # noqa: E402
from inference.serving.host import this_host  # noqa: E402
from inference.serving.records import pair_spec  # noqa: E402
from inference.serving.registry import build_engine  # noqa: E402

ROUNDS = 8
NEW_TOKENS = 64
POOL_MB = 2048
FILE = open(__file__.replace("paged_engine_bars.py", "../../../inference/engines/own/engine.py")).read()


def timed(step: Callable[[], object]) -> float:
    began = time.perf_counter()
    step()
    return time.perf_counter() - began


def ms(seconds: list[float]) -> str:
    return f"{statistics.median(seconds) * 1000:.3g} ms"


def step_costs(engine: OwnEngine, prompt: list[int]) -> tuple[str, float]:
    """The table's row, and the main alone's token in seconds."""
    main, draft = engine.main.sequence(exact=True), engine.draft.sequence()
    main.prefill(prompt)
    draft.prefill(prompt)
    one, drafted, verify, rollback, after = [], [], [], [], []
    for _ in range(ROUNDS):
        one.append(timed(lambda: main.feed([5])))
        drafted.append(timed(lambda: draft.feed([5])))
        verify.append(timed(lambda: main.feed([5, 6, 7, 8, 9, 10, 11])))
        rollback.append(timed(lambda: main.drop_last(3)))
        after.append(timed(lambda: main.feed([5])))
    main.close()
    draft.close()
    return (f"| {len(prompt):,} | {ms(one)} | {ms(verify)} | {statistics.median(rollback) * 1000:.4f} ms | "
            f"{ms(after)} | {ms(drafted)} |"), statistics.median(one)


def answer(engine: Engine, prompt_ids: list[int], *, k: int | None, scope: str = "", tokens: int = NEW_TOKENS
           ) -> tuple[list[int], float, float]:
    """Tokens, seconds to the first token, seconds in all (k 0 or None: the main alone)."""
    params = DecodingParams(max_new_tokens=tokens, ignore_eos=True, cache_scope=scope,
                            speculation=Speculation(k=k) if k else None)
    request = engine.submit(prompt_ids=prompt_ids, params=params)
    out, first = [], None
    while not isinstance(event := request.events.get(timeout=600), Finished):
        if isinstance(event, StepTokens):
            first = first or time.perf_counter()
            out += event.token_ids
    assert event.finish_reason == "length", event
    return out, first - request.added_at, time.perf_counter() - request.added_at


def tokens_per_s(engine: Engine, prompts: list[list[int]], *, k: int | None) -> float:
    """Aggregate tokens/s of len(prompts) answers at once."""
    began = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        done = list(pool.map(lambda ids: answer(engine, ids, k=k), prompts))
    return sum(len(tokens) for tokens, _, _ in done) / (time.perf_counter() - began)


def main() -> None:
    pair = ModelPair.objects.get(slug="qwen2.5-coder-1.5b")
    spec = replace(pair_spec(pair=pair, route=Route.OWN_SPECULATIVE), kv_pool_mb=POOL_MB)
    capabilities = list(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    configs = [config for config in precision.offered(capabilities) if config.name != "f32"
               and (config.name in sys.argv[1:] or config.name in precision.EXACT_ON_OWN_ENGINE or not sys.argv[1:])]
    owns = {config.name: OwnEngine(replace(spec, prefix_caching=False, **config.fields))
            for config in configs if config.name in precision.EXACT_ON_OWN_ENGINE}
    own = owns["f32-dynamic"]
    encode = own.tokenizer.encode
    print(f"host: {this_host().described}; pool {own.main.pool.blocks} main blocks of {own.main.pool.block_tokens}")
    rng = np.random.default_rng(0)
    token_s = {}
    for name, engine in owns.items():
        print(f"\nown engine, {name}\n| context | main alone's token | verify of 7 | taking back 3 | token after | draft token |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: |")
        for context in (50, 1000, 2000):
            row, token_s[name, context] = step_costs(engine, rng.integers(100, 30000, context).tolist())
            print(row, flush=True)

    fastest_own = owns[min(owns, key=lambda name: token_s[name, 2000])]
    print(f"\nthe own engine's faster configuration here: {fastest_own.spec.inference_precision}"
          f"{' with dynamic quantization' if fastest_own.spec.dynamic_quantization else ''}")
    cached = OwnEngine(replace(fastest_own.spec, prefix_caching=True))
    conversation = encode("Here is a module:\n" + FILE[:6500] + "\nWhat does Decoding.run do?\n").input_ids.data[0].tolist()
    first_turn, _, _ = answer(cached, conversation, k=0, scope="user:alice")
    follow = conversation + first_turn + encode("\nAnd _emit?\n", add_special_tokens=False).input_ids.data[0].tolist()
    warm, cold = [], []
    for index in range(3):  # interleaved; a cold read by another user each time, who finds none of Alice's blocks
        warm.append(answer(cached, follow, k=0, scope="user:alice", tokens=2)[1])
        cold.append(answer(cached, follow, k=0, scope=f"user:other{index}", tokens=2)[1])
    print(f"\nfollow-up of {len(follow):,} tokens, first token (main alone): cached {ms(warm)} (Alice), cold {ms(cold)} "
          f"(another user)")
    cached.close()

    short = [encode(text, add_special_tokens=False).input_ids.data[0].tolist()
             for text in chat_prompts(own.spec.main_dir, 4)]
    long_ = [encode(FILE[index * 400:index * 400 + 6500] + "\nSummarise this code.\n").input_ids.data[0].tolist()
             for index in range(4)]
    libraries = {config.name: build_engine(replace(pair_spec(pair=pair, route=Route.LIBRARY_MAIN_ALONE),
                                                   prefix_caching=False, **config.fields)) for config in configs}
    print(f"\nmain alone, tokens/s over whole answers ({NEW_TOKENS} new tokens), median of 3 interleaved rounds")
    print("| prompt | streams | " + " | ".join(f"own {name}" for name in owns) + " | "
          + " | ".join(f"library {name}" for name in libraries) + " | best own / best library | own K=4 |")
    print("| --- | ---: |" + " ---: |" * (len(owns) + len(libraries) + 2))
    for label, prompts in (("~50 tokens", short), (f"~{len(long_[0]):,} tokens", long_)):
        for streams in (1, 4):
            rates: dict[str, list[float]] = {"own-k4": []}
            for _ in range(3):
                for name, engine in owns.items():
                    rates.setdefault(f"own {name}", []).append(tokens_per_s(engine, prompts[:streams], k=0))
                rates["own-k4"].append(tokens_per_s(fastest_own, prompts[:streams], k=4))
                for name, library in libraries.items():
                    rates.setdefault(name, []).append(tokens_per_s(library, prompts[:streams], k=None))
            median = {name: statistics.median(values) for name, values in rates.items()}
            best_own = max(median[f"own {name}"] for name in owns)
            best_library = max(median[name] for name in libraries)
            print(f"| {label} | {streams} | " + " | ".join(f"{median[f'own {name}']:.1f}" for name in owns) + " | "
                  + " | ".join(f"{median[name]:.1f}" for name in libraries)
                  + f" | {best_own / best_library:.2f}x | {median['own-k4']:.1f} |", flush=True)
    same = sum(answer(fastest_own, ids, k=0, tokens=96)[0] == answer(fastest_own, ids, k=4, tokens=96)[0]
               for ids in short + long_)
    print(f"\ngreedy, 96 tokens: K=4 equals the main alone on {same} of {len(short + long_)} prompts")
    for engine in [*libraries.values(), *owns.values()]:
        engine.close()


if __name__ == "__main__":
    main()
