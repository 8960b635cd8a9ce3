"""A chat's first follow-up, sent a second after the first answer, while the draft reads the paste it was left out of
(engines/own/engine.py, `catch_up_draft`): its first token and its whole turn, with the draft's chunks waiting while
the main reads a prompt (as it ships) and without that wait (switched off on this engine instance only). The held-out
pasted chats of conversations.json and code-edit-conversations-b.json, greedy, K=3, answers ending at EOS or 48 tokens;
the two lines interleaved, each run under a cache scope of its own so that neither finds the other's blocks.

    DJANGO_DEBUG=1 ROUNDS=2 .venv/bin/python docs/benchmark/real-pair/catch_up_yield.py
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
django.setup()

from inference.engines.decoding import DecodingParams, Speculation  # noqa: E402
from inference.engines.interface import Finished, StepTokens  # noqa: E402
from inference.engines.own.engine import OwnEngine  # noqa: E402
from inference.limits import Route  # noqa: E402
from inference.models import ModelPair  # noqa: E402
from inference.serving.records import pair_spec  # noqa: E402

HERE = Path(__file__).parent
ROUNDS = int(os.environ.get("ROUNDS", "2"))
TOKENS = 48
USER_READS_S = 1.0  # between the answer and the follow-up


def ask(engine: OwnEngine, ids: list[int], scope: str) -> tuple[list[int], float, float, int]:
    """The answer's tokens, its first token's and its end's seconds, and its prompt tokens found cached."""
    started = time.perf_counter()
    request = engine.submit(prompt_ids=ids, params=DecodingParams(max_new_tokens=TOKENS, speculation=Speculation(k=3),
                                                                  cache_scope=scope))
    tokens: list[int] = []
    first = None
    while not isinstance(event := request.events.get(timeout=600), Finished):
        if isinstance(event, StepTokens):
            first = first or time.perf_counter() - started
            tokens += event.token_ids
    assert first is not None, event
    return tokens, first, time.perf_counter() - started, request.cached_tokens


def main() -> None:
    pair = ModelPair.objects.get(slug="qwen2.5-coder-1.5b")
    engine = OwnEngine(pair_spec(pair=pair, route=Route.OWN_SPECULATIVE))
    yields = engine.main.prompts_read
    chats = [chat for name in ("conversations.json", "code-edit-conversations-b.json")
             for chat in json.loads((HERE / name).read_text())]

    def ids(messages: list[dict]) -> list[int]:
        text = str(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        return engine.tokenizer.encode(text, add_special_tokens=False).input_ids.data[0].tolist()

    lines: dict[str, list[tuple[float, float]]] = {"as it ships (the draft waits)": [], "the draft reads on": []}
    for repeat in range(ROUNDS):
        for number, chat in enumerate(chats):
            order = list(lines) if (repeat + number) % 2 == 0 else list(reversed(lines))
            for line in order:
                engine.main.prompts_read = yields if line.startswith("as it ships") else lambda *, timeout: None
                scope = f"{line}-{repeat}-{chat['name']}"
                messages = [{"role": "system", "content": chat["system"]},
                            {"role": "user", "content": chat["turns"][0]}]
                first_ids = ids(messages)
                answer, _, _, _ = ask(engine, first_ids, scope)
                time.sleep(USER_READS_S)
                said = engine.tokenizer.decode(answer, skip_special_tokens=True)
                messages += [{"role": "assistant", "content": said}, {"role": "user", "content": chat["turns"][1]}]
                follow_ids = ids(messages)
                _, ttft, whole, cached = ask(engine, follow_ids, scope)
                engine.draft_caught_up(timeout=600)
                lines[line].append((ttft, whole))
                print(f"{chat['name']:>14} round {repeat}: {line:<30} paste {len(first_ids)} tokens, follow-up "
                      f"{len(follow_ids)} ({cached} cached): first token {ttft:.2f} s, whole turn {whole:.2f} s",
                      flush=True)
    for line, runs in lines.items():
        print(f"{line:<30} first token median {statistics.median(t for t, _ in runs):.2f} s "
              f"(max {max(t for t, _ in runs):.2f}), whole turn median {statistics.median(w for _, w in runs):.2f} s")


if __name__ == "__main__":
    main()
