"""The own engine's two exact arrangements of the main's rows side by side (engines/own/model_runner.py, `arranged`;
docs/exactness.md#one-kernel-path): queries (Q: the main alone's token a 2-token query, a verify one query) and
one-token sequences (T: every token its own sequence). Two engines of the real pair in one process, as a worker
loads it on this host, each forced into one arrangement; each round runs every line on one engine, then the other
(the order turned each round):
- a pasted class (code-edit-conversations-b.json's first) read cold: the first token;
- one request of chat-b.json, 128 tokens: at the host's calibrated K, and the main alone;
- four of chat-b.json at once, 96 tokens each: the main alone;
- one pasted-class edit (read into the caches first), 160 tokens: as shipped (the K and the lookup), the main alone;
- four pasted-class edits at once, 128 tokens each: as shipped (the lookup in the batch), the main alone.
Greedy, EOS ignored. Prints each line's figures per round, then T/Q of the medians, and whether each engine's answers
with and without speculation were alike.

    DJANGO_DEBUG=1 ROUNDS=3 .venv/bin/python docs/benchmark/real-pair/arrangements.py
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from dataclasses import replace
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
django.setup()

from inference.engines.decoding import DecodingParams, Speculation  # noqa: E402
from inference.engines.interface import Finished, StepTokens  # noqa: E402
from inference.engines.own.engine import OwnEngine  # noqa: E402
from inference.engines.own.scheduler import Scheduler  # noqa: E402
from inference.limits import Route  # noqa: E402
from inference.models import ModelPair  # noqa: E402
from inference.serving.calibrated import host_figures  # noqa: E402
from inference.serving.host import this_host  # noqa: E402
from inference.serving.records import pair_spec  # noqa: E402

HERE = Path(__file__).parent
ROUNDS = int(os.environ.get("ROUNDS", "3"))


def answer(engine: OwnEngine, ids: list[int], speculation: Speculation | None, tokens: int, out: dict) -> None:
    started = time.perf_counter()
    request = engine.submit(prompt_ids=ids, params=DecodingParams(max_new_tokens=tokens, ignore_eos=True,
                                                                  speculation=speculation))
    got: list[int] = []
    first = 0.0
    while not isinstance(event := request.events.get(timeout=900), Finished):
        if isinstance(event, StepTokens):
            first = first or time.perf_counter()
            got += event.token_ids
    out.update(tokens=got, first=first - started, last=time.perf_counter(), started=started)


def at_once(engine: OwnEngine, prompts: list[list[int]], speculation: Speculation | None,
            tokens: int) -> tuple[float, list[float], list[list[int]]]:
    """Tokens a second over the answers (first token to last), each one's first token, their tokens."""
    outs: list[dict] = [{} for _ in prompts]
    threads = [threading.Thread(target=answer, args=(engine, prompt, speculation, tokens, out))
               for prompt, out in zip(prompts, outs, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = max(out["last"] for out in outs) - min(out["started"] + out["first"] for out in outs)
    return (sum(len(out["tokens"]) for out in outs) / seconds, [out["first"] for out in outs],
            [out["tokens"] for out in outs])


def main() -> None:
    pair = ModelPair.objects.get(slug="qwen2.5-coder-1.5b")
    figures = host_figures(pair=pair, host=this_host(pair.device))
    spec = replace(pair_spec(pair=pair, route=Route.OWN_SPECULATIVE, calibration=figures), kv_pool_mb=1500)
    k = figures.k_at(1) or 2
    shipped = Speculation(k=k, batch_k=figures.batch_k or None)
    engines = {}
    for name, token_rows in (("Q", False), ("T", True)):
        engine = OwnEngine(spec)
        runner = engine.main.runner
        runner.steady = runner.arranged(token_rows=token_rows)
        if token_rows and not runner.alike_as_tokens(runner.steady):
            raise SystemExit("one-token sequences part from the main alone's rows here: not served")
        engine.main.scheduler = Scheduler(runner)
        engines[name] = engine
    print(f"{this_host().described}; K={k}, {spec.inference_precision}", flush=True)

    def ids(engine: OwnEngine, messages: list[dict]) -> list[int]:
        text = str(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        return engine.tokenizer.encode(text, add_special_tokens=False).input_ids.data[0].tolist()

    short = [chat["messages"] for chat in json.loads((HERE / "chat-b.json").read_text())[:4]]
    pastes = [[{"role": "system", "content": chat["system"]}, {"role": "user", "content": chat["turns"][0]}]
              for chat in json.loads((HERE / "code-edit-conversations-b.json").read_text())]
    figures_by: dict[tuple[str, str], list[float]] = {}
    alike: dict[str, list[bool]] = {"Q": [], "T": []}
    for round_ in range(ROUNDS):
        for name in ("Q", "T") if round_ % 2 == 0 else ("T", "Q"):
            engine = engines[name]
            asked, edits = [ids(engine, m) for m in short], [ids(engine, m) for m in pastes]
            cold = ids(engine, [{"role": "system", "content": f"Round {round_}, {name}, {time.time()}"}, pastes[0][1]])
            cold_first = at_once(engine, [cold], None, 8)[1][0]  # a new system prompt: nothing of it cached
            for edit in edits:  # read into both caches: the timed answers decode
                at_once(engine, [edit], shipped, 4)
                engine.draft_caught_up(timeout=600)
            speculating, _, with_k = at_once(engine, asked[:1], shipped, 128)
            alone, _, without = at_once(engine, asked[:1], None, 128)
            edit_shipped, _, edit_with = at_once(engine, edits[:1], shipped, 160)
            edit_alone, _, edit_without = at_once(engine, edits[:1], None, 160)
            alike[name] += [with_k == without, edit_with == edit_without]
            measured = {"a pasted class read cold: first token (s)": cold_first,
                        f"one short answer, K={k}": speculating, "one short answer, the main alone": alone,
                        "four short answers at once, the main alone": at_once(engine, asked, None, 96)[0],
                        "one code edit, as shipped": edit_shipped, "one code edit, the main alone": edit_alone,
                        "four code edits at once, as shipped": at_once(engine, edits * 2, shipped, 128)[0],
                        "four code edits at once, the main alone": at_once(engine, edits * 2, None, 128)[0]}
            for line, value in measured.items():
                figures_by.setdefault((name, line), []).append(value)
            print(f"round {round_} {name}: " + "; ".join(f"{line} {value:.2f}" for line, value in measured.items()),
                  flush=True)
    print()
    for line in dict.fromkeys(line for _, line in figures_by):
        q, t = figures_by[("Q", line)], figures_by[("T", line)]
        print(f"{line:45} Q {', '.join(f'{x:.2f}' for x in q):20} T {', '.join(f'{x:.2f}' for x in t):20} "
              f"T/Q {statistics.median(t) / statistics.median(q):.2f}")
    print(f"answers with and without speculation alike: Q {sum(alike['Q'])}/{len(alike['Q'])}, "
          f"T {sum(alike['T'])}/{len(alike['T'])}")


if __name__ == "__main__":
    main()
