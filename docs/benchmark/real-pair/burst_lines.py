"""The script behind docs/calibration.md's "Under load" table: a burst that arrives while a lone answer runs, through
SpecChat's API. One answer starts alone; once its first tokens stream, N-1 more requests come at once; the line's
figure is the burst's tokens over the time from the first request to the last answer's end. Three lines, interleaved,
the order turned each repeat:
- "as it ships": every request leaves speculation to the pair (the lone one speculates on the own engine, and joins
  the others on the library's main alone when they come, where the host measured that faster);
- "lone one stays": the lone request names the K the calibration chose, so it stays on the own engine beside them
  (how the pair served such a burst before);
- "speculative: false": every request runs the main alone.

Usage: burst_lines.py URL KEY MODEL K REPEATS TOKENS STREAMS (the prompts: chat-b.json, the first for the lone one)."""
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

URL, KEY, MODEL, K = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
REPEATS, TOKENS, STREAMS = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
PROMPTS = json.loads(Path(__file__).with_name("chat-b.json").read_text())
LINES = {"as it ships": ({}, {}), "lone one stays": ({"num_assistant_tokens": K}, {}),
         "speculative: false": ({"speculative": False}, {"speculative": False})}


def ask(item: dict, extra: dict, started: threading.Event | None = None) -> tuple[int, str]:
    """One streamed answer: its tokens and route (setting `started` at its first text)."""
    body = {"model": MODEL, "messages": item["messages"], "max_tokens": TOKENS, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **extra}
    usage = {}
    with requests.post(f"{URL}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                       stream=True, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content") and started:
                started.set()
            usage = chunk.get("usage") or usage
    return usage["completion_tokens"], f"{usage['speculative_route']} {usage['speculative_reason_codes']}"


def burst(lone_extra: dict, extra: dict, prompts: list[dict]) -> tuple[int, float, list[str]]:
    began, started = time.perf_counter(), threading.Event()
    with ThreadPoolExecutor(STREAMS) as pool:
        lone = pool.submit(ask, prompts[0], lone_extra, started)
        started.wait(120)
        rest = list(pool.map(lambda item: ask(item, extra), prompts[1:STREAMS]))
        answers = [lone.result(), *rest]
    return sum(tokens for tokens, _ in answers), time.perf_counter() - began, [route for _, route in answers]


totals = {name: [0, 0.0] for name in LINES}
for repeat in range(REPEATS):
    names = list(LINES)[repeat % len(LINES):] + list(LINES)[:repeat % len(LINES)]
    for offset in range(0, len(PROMPTS), STREAMS):
        prompts = (PROMPTS[offset:] + PROMPTS[:offset])[:STREAMS]
        for name in names:
            tokens, seconds, routes = burst(*LINES[name], prompts)
            totals[name][0] += tokens
            totals[name][1] += seconds
            print(f"repeat {repeat + 1} {name}: {tokens / seconds:.1f} tok/s; the lone one: {routes[0]}", flush=True)
for name, (tokens, seconds) in totals.items():
    print(f"{name}: {tokens / seconds:.2f} tok/s over {tokens} tokens")
