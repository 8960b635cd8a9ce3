"""Speculation after a pasted file, in-process on the real pair's own engine: a code-edit conversation (a pasted
module, then edits that copy it), every turn answered by each line from the same history, greedy.

Lines: the main alone (K=0); the draft with the conversation's lookup chained before it (K=4, as an uncalibrated
host serves); the conversation's lookup alone (`lookup_only`, as `calibrated-long-context-lookup` serves), with a
longer match proposing further (up to LONGEST_LOOKUP) and with a fixed 8 (LOOKUP_TOKENS, as before). Greedy answers
are the main alone's on every line, so each turn's history is the same for all; the cache scope is shared, so every
line reads the paste from the cache but the first (its first token is left out of the figures: tokens a second
count from the first token to the last). Each line's answers are checked against the main alone's, and an answer
that loops is named.

    DJANGO_DEBUG=1 .venv/bin/python docs/benchmark/real-pair/lookup_lines.py [CONVERSATIONS [TOKENS [TURNS]]]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
django.setup()

from inference.benchmark.modes import LOOPING  # noqa: E402
from inference.benchmark.prompts import repeated_ngram_share  # noqa: E402
from inference.engines.decoding import DecodingParams, Speculation  # noqa: E402
from inference.engines.interface import Finished, StepTokens  # noqa: E402
from inference.engines.own.engine import OwnEngine  # noqa: E402
from inference.engines.own.proposers import prompt_lookup  # noqa: E402
from inference.limits import Route  # noqa: E402
from inference.models import ModelPair  # noqa: E402
from inference.serving.records import pair_spec  # noqa: E402

HERE = Path(__file__).parent
FILE = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "code-edit-conversations.json"
TOKENS = int(sys.argv[2]) if len(sys.argv) > 2 else 128
TURNS = int(sys.argv[3]) if len(sys.argv) > 3 else 6
LINES = {  # name: (K, lookup_only, longest lookup)
    "main alone": (0, False, prompt_lookup.LONGEST_LOOKUP),
    "draft, lookup chained (K=4)": (4, False, prompt_lookup.LONGEST_LOOKUP),
    "lookup alone": (4, True, prompt_lookup.LONGEST_LOOKUP),
    "lookup alone, fixed 8": (4, True, prompt_lookup.LOOKUP_TOKENS),
}


def run(engine: OwnEngine, prompt: str, *, k: int, lookup_only: bool) -> tuple[list[int], float, float, dict]:
    """Tokens, seconds to the first token, seconds after it, and tokens proposed and kept by each drafter."""
    engine.draft_caught_up(timeout=900)  # a draft left out of the last answer reads it first: not in this line's time
    started = time.perf_counter()
    request = engine.submit(prompt=prompt, add_special_tokens=False, params=DecodingParams(
        max_new_tokens=TOKENS, speculation=Speculation(k=k, lookup_only=lookup_only) if k else None,
        cache_scope="lines"))
    tokens: list[int] = []
    first = None
    drafters: dict[str, list[int]] = {}
    while not isinstance(event := request.events.get(timeout=900), Finished):
        if not isinstance(event, StepTokens):
            continue
        first = first or event.at
        tokens += event.token_ids
        if event.drafter is not None and event.proposed:
            seen = drafters.setdefault(str(event.drafter), [0, 0])
            seen[0] += event.proposed
            seen[1] += len(event.token_ids) - 1
    assert event.finish_reason in ("stop", "length"), event
    return tokens, first - started, time.perf_counter() - first, drafters


def main() -> None:
    pair = ModelPair.objects.get(slug="qwen2.5-coder-1.5b")
    engine = OwnEngine(replace(pair_spec(pair=pair, route=Route.OWN_SPECULATIVE), kv_pool_mb=1536))
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    print(next(line for line in cpu.splitlines() if line.startswith("Model name")), "|", FILE.name,
          f"| {TOKENS} tokens a turn, greedy, EOS ends a turn | main steps {engine.main.runner.steady}")
    totals = {line: [0, 0.0] for line in LINES}
    for conversation in json.loads(FILE.read_text()):
        messages = [{"role": "system", "content": conversation["system"]}]
        for turn, asked in enumerate(conversation["turns"][:TURNS]):
            messages.append({"role": "user", "content": asked})
            prompt = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            alone = None
            for line, (k, lookup_only, longest) in LINES.items():
                prompt_lookup.LONGEST_LOOKUP = longest
                tokens, first, after, drafters = run(engine, prompt, k=k, lookup_only=lookup_only)
                alone = alone or tokens
                same = "same" if tokens == alone else "DIFFERS"
                rate = (len(tokens) - 1) / after if after else 0.0
                totals[line][0] += len(tokens) - 1
                totals[line][1] += after
                print(f"{conversation['name']} turn {turn + 1}: {line:30s} first token {first:6.2f} s, "
                      f"{rate:5.2f} tok/s after it, {len(tokens)} tokens, {same}; proposed/kept {drafters}",
                      flush=True)
            text = engine.tokenizer.decode(alone)
            if repeated_ngram_share(text) > LOOPING:
                print(f"{conversation['name']} turn {turn + 1}: the answer loops (its 4-grams mostly repeats)")
            messages.append({"role": "assistant", "content": text})
            prompt_lookup.LONGEST_LOOKUP = LINES["lookup alone"][2]
    base = totals["main alone"][0] / totals["main alone"][1]
    for line, (tokens, seconds) in totals.items():
        print(f"{line:30s} {tokens / seconds:6.2f} tok/s over the conversations ({tokens / seconds / base:.2f}x)")


if __name__ == "__main__":
    main()
