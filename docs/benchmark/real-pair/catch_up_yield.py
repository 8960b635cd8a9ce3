"""A chat's first follow-up, sent after the first answer, while the draft reads the paste it was left out of
(engines/own/engine.py, `catch_up_draft`): its first token, the longest the stream then stands still, and its whole
turn. As it ships, the draft reads in the scheduler's chunks, each waiting while the main reads a prompt, a chunk
under way cancelled as one starts, and the follow-up goes on without the draft until the reading is done; four lines
switch one of these on this engine instance only: chunks under way not cancelled (as before 2026-11-30's night), the
draft reading in chunks of 64, the draft reading on through prompts, and the follow-up standing still after its first
token until the draft has read (as the engine did before). `LINES` picks some (comma-separated); `USER_READS_S` the
seconds between the answer and the follow-up (0: sent as the answer ends, as `manage.py benchmark --conversations`
sends it). The held-out pasted chats of conversations.json and code-edit-conversations-b.json, greedy, K=3, answers
ending at EOS or 48 tokens; the lines interleaved, each run under a cache scope of its own so that none finds
another's blocks. (A first chunk of 64, as shipped 2026-11-30 evening to night, gave the cancelled chunks' first
tokens and whole turns on the AMD Zen 4 host: docs/benchmark/real-pair/zen4-2026-11-30b/catch-up-cancelled.txt.)

    DJANGO_DEBUG=1 ROUNDS=2 USER_READS_S=1 .venv/bin/python docs/benchmark/real-pair/catch_up_yield.py
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import time
from pathlib import Path
from typing import NamedTuple

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
django.setup()

from inference.engines.decoding import DecodingParams, Speculation  # noqa: E402
from inference.engines.interface import Finished, StepTokens  # noqa: E402
from inference.engines.own.engine import Decoding, OwnEngine  # noqa: E402
from inference.limits import Route  # noqa: E402
from inference.models import ModelPair  # noqa: E402
from inference.serving.calibrated import host_figures  # noqa: E402
from inference.serving.host import this_host  # noqa: E402
from inference.serving.records import pair_spec  # noqa: E402

HERE = Path(__file__).parent
ROUNDS = int(os.environ.get("ROUNDS", "2"))
TOKENS = 48
USER_READS_S = float(os.environ.get("USER_READS_S", "1"))  # between the answer and the follow-up
SHIPS, NOT_CANCELLED, SMALL_CHUNKS, READS_ON, WAITS = (
    "as it ships", "chunks not cancelled", "chunks of 64", "the draft reads on", "the follow-up waits")
LINES = os.environ.get("LINES", ",".join((SHIPS, NOT_CANCELLED, SMALL_CHUNKS, READS_ON, WAITS))).split(",")


class Turn(NamedTuple):
    tokens: list[int]
    first: float  # seconds to its first token
    still: float  # the longest gap between two deliveries after it
    whole: float
    cached: int  # prompt tokens found cached


def ask(engine: OwnEngine, ids: list[int], scope: str) -> Turn:
    started = time.perf_counter()
    request = engine.submit(prompt_ids=ids, params=DecodingParams(max_new_tokens=TOKENS, speculation=Speculation(k=3),
                                                                  cache_scope=scope))
    tokens: list[int] = []
    delivered: list[float] = []
    while not isinstance(event := request.events.get(timeout=600), Finished):
        if isinstance(event, StepTokens):
            delivered.append(time.perf_counter() - started)
            tokens += event.token_ids
    assert delivered, event
    still = max((b - a for a, b in itertools.pairwise(delivered)), default=0.0)
    return Turn(tokens, delivered[0], still, time.perf_counter() - started, request.cached_tokens)


def main() -> None:
    pair = ModelPair.objects.get(slug="qwen2.5-coder-1.5b")
    calibration = host_figures(pair=pair, host=this_host(pair.device))  # the configuration the pair is served in
    engine = OwnEngine(pair_spec(pair=pair, route=Route.OWN_SPECULATIVE, calibration=calibration))
    yields = engine.main.prompts_read
    gives_way = engine.draft.scheduler.yields_while
    draft_chunk = engine.draft.scheduler.chunk_tokens
    joins = Decoding._draft_joins_once_caught_up

    def waits(decoding: Decoding) -> None:
        if decoding.set_aside is not None:
            decoding.engine.draft_caught_up()  # the answer's first call, after its first token: it stands still
        joins(decoding)
    chats = [chat for name in ("conversations.json", "code-edit-conversations-b.json")
             for chat in json.loads((HERE / name).read_text())]

    def ids(messages: list[dict]) -> list[int]:
        text = str(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        return engine.tokenizer.encode(text, add_special_tokens=False).input_ids.data[0].tolist()

    lines: dict[str, list[Turn]] = {line: [] for line in LINES}
    for repeat in range(ROUNDS):
        for number, chat in enumerate(chats):
            rotated = (repeat * len(chats) + number) % len(lines)
            for line in list(lines)[rotated:] + list(lines)[:rotated]:
                engine.main.prompts_read = (lambda *, timeout: None) if line == READS_ON else yields
                engine.draft.scheduler.yields_while = None if line in (READS_ON, NOT_CANCELLED) else gives_way
                engine.draft.scheduler.chunk_tokens = 64 if line == SMALL_CHUNKS else draft_chunk
                Decoding._draft_joins_once_caught_up = waits if line == WAITS else joins  # type: ignore[method-assign]
                scope = f"{line}-{repeat}-{chat['name']}"
                messages = [{"role": "system", "content": chat["system"]},
                            {"role": "user", "content": chat["turns"][0]}]
                first_ids = ids(messages)
                answer = ask(engine, first_ids, scope).tokens
                time.sleep(USER_READS_S)
                said = engine.tokenizer.decode(answer, skip_special_tokens=True)
                messages += [{"role": "assistant", "content": said}, {"role": "user", "content": chat["turns"][1]}]
                follow_ids = ids(messages)
                turn = ask(engine, follow_ids, scope)
                engine.draft_caught_up(timeout=600)
                lines[line].append(turn)
                print(f"{chat['name']:>14} round {repeat}: {line:<20} paste {len(first_ids)} tokens, follow-up "
                      f"{len(follow_ids)} ({turn.cached} cached): first token {turn.first:.2f} s, then still at "
                      f"most {turn.still:.2f} s, whole turn {turn.whole:.2f} s", flush=True)
    for line, turns in lines.items():
        print(f"{line:<20} first token median {statistics.median(t.first for t in turns):.2f} s "
              f"(max {max(t.first for t in turns):.2f}), still at most: median "
              f"{statistics.median(t.still for t in turns):.2f} s (max {max(t.still for t in turns):.2f}), "
              f"whole turn median {statistics.median(t.whole for t in turns):.2f} s "
              f"(sum {sum(t.whole for t in turns):.1f})")


if __name__ == "__main__":
    main()
