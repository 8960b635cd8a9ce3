"""Four code edits at once on the own engine, beyond the pair's speculating streams (engines/own/engine.py,
`_join_batch_if_busy`): as it ships, each answer in the batch goes on with the conversation's lookup where the host's
calibration found no K for the batch; `speculative: false`, each is the main alone. The first turns of the held-out
code-edit-conversations-b.json (a pasted class, then "Show the whole class" with an edit) and, for answers that do not
copy, of conversations.json (questions about a pasted module), each read into the main's and the draft's caches first
so that the timed answers decode; greedy, EOS ignored, `TOKENS` a turn, the lines interleaved, `ROUNDS` rounds. Prints each
line's tokens a second over the four (first token to last), how many tokens the lookup proposed and kept, and
whether the answers are the main alone's.

    DJANGO_DEBUG=1 ROUNDS=2 .venv/bin/python docs/benchmark/real-pair/batch_lookup.py
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
django.setup()

from inference.engines.decoding import DecodingParams, Speculation  # noqa: E402
from inference.engines.interface import Finished, JoinedBatch, StepTokens  # noqa: E402
from inference.engines.own.engine import OwnEngine  # noqa: E402
from inference.limits import Drafter, Route  # noqa: E402
from inference.models import ModelPair  # noqa: E402
from inference.serving.calibrated import host_figures  # noqa: E402
from inference.serving.host import this_host  # noqa: E402
from inference.serving.records import pair_spec  # noqa: E402

HERE = Path(__file__).parent
ROUNDS = int(os.environ.get("ROUNDS", "2"))
TOKENS = int(os.environ.get("TOKENS", "160"))
WORKLOADS = {"code edits": "code-edit-conversations-b.json", "questions": "conversations.json"}


def answer(engine: OwnEngine, ids: list[int], speculation: Speculation | None, out: dict) -> None:
    started = time.perf_counter()
    request = engine.submit(prompt_ids=ids, params=DecodingParams(max_new_tokens=TOKENS, ignore_eos=True,
                                                                  speculation=speculation))
    tokens: list[int] = []
    first = proposed = kept = 0.0
    while not isinstance(event := request.events.get(timeout=900), Finished):
        if isinstance(event, StepTokens):
            first = first or time.perf_counter()
            tokens += event.token_ids
            if event.drafter == Drafter.NGRAM and event.proposed:
                proposed += event.proposed
                kept += len(event.token_ids) - 1
        elif isinstance(event, JoinedBatch):
            out.setdefault("joined", []).append(event)
    out.update(tokens=tokens, first=first - started, last=time.perf_counter(), started=started, proposed=proposed,
               kept=kept)


def main() -> None:
    pair = ModelPair.objects.get(slug="qwen2.5-coder-1.5b")
    figures = host_figures(pair=pair, host=this_host(pair.device))
    spec = pair_spec(pair=pair, route=Route.OWN_SPECULATIVE, calibration=figures)
    engine = OwnEngine(spec)
    k = figures.k_at(1) or 3
    shipped = Speculation(k=k, batch_k=figures.batch_k or None)
    print(f"{this_host().described}; K={k} alone, {spec.speculating_streams} speculating stream(s), batch K "
          f"{figures.batch_k or 'none (the lookup alone in the batch)'}; {TOKENS} tokens, greedy, EOS ignored")

    def ids(chat: dict) -> list[int]:
        text = str(engine.tokenizer.apply_chat_template(
            [{"role": "system", "content": chat["system"]}, {"role": "user", "content": chat["turns"][0]}],
            add_generation_prompt=True))
        return engine.tokenizer.encode(text, add_special_tokens=False).input_ids.data[0].tolist()

    for workload, name in WORKLOADS.items():
        chats = json.loads((HERE / name).read_text())
        prompts = [ids(chat) for chat in chats] * (4 // len(chats))
        for prompt in prompts[:len(chats)]:  # read into both caches: the timed answers decode
            answer(engine, prompt, shipped, {})
            engine.draft_caught_up(timeout=600)
        texts: dict[str, list[list[int]]] = {}
        for round_ in range(ROUNDS):
            lines = [("as it ships", shipped), ("speculative: false", None)]
            for line, speculation in lines if round_ % 2 == 0 else lines[::-1]:
                outs: list[dict] = [{} for _ in prompts]
                threads = [threading.Thread(target=answer, args=(engine, prompt, speculation, out))
                           for prompt, out in zip(prompts, outs, strict=True)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                tokens = sum(len(out["tokens"]) for out in outs)
                seconds = max(out["last"] for out in outs) - min(out["started"] + out["first"] for out in outs)
                texts.setdefault(line, [out["tokens"] for out in outs])
                proposed, kept = sum(out["proposed"] for out in outs), sum(out["kept"] for out in outs)
                joined = sum(bool(out.get("joined")) for out in outs)
                firsts = ", ".join(f"{out['first']:.2f}" for out in outs)
                print(f"{workload:>10} round {round_}: {line:<18} {tokens / seconds:5.1f} tok/s over the four "
                      f"({tokens} tokens), first tokens {firsts} s; the "
                      f"lookup proposed {proposed:.0f}, kept {kept:.0f}; {joined} joined the batch", flush=True)
        same = sum(a == b for a, b in zip(texts["as it ships"], texts["speculative: false"], strict=True))
        print(f"{workload:>10}: {same} of {len(prompts)} answers as it ships the main alone's")


if __name__ == "__main__":
    main()
