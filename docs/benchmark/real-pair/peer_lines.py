"""The script behind docs/benchmark.md's peer tables: OpenAI-compatible servers (SpecChat, llama-server lines)
asked the same chat requests, greedy, at 1 and 4 streams, interleaved. Usage: peer_lines.py LINES_JSON REPEATS TOKENS
LEVELS [WARM], LINES_JSON {name: {"url", "model", "key", "extra"}}. Each line first answers WARM chat-a requests,
untimed (an engine's first inferences compile and repack). llama-server's `ngram-mod` keeps the n-grams of every
answer it served: a second repeat of the same requests finds its answers there, so run it once per fresh server."""
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import requests

HERE = Path(__file__).parent
PROMPTS = json.loads((HERE / "chat-b.json").read_text())
LINES = json.loads(sys.argv[1])  # {name: {"url":..., "model":..., "key":..., "extra": {...}}}
REPEATS, TOKENS = int(sys.argv[2]), int(sys.argv[3])
LEVELS = [int(x) for x in sys.argv[4].split(",")]
WARM = json.loads((HERE / "chat-a.json").read_text())[:int(sys.argv[5]) if len(sys.argv) > 5 else 0]

def ask(line, item):
    body = {"model": line["model"], "messages": item["messages"] if isinstance(item, dict) else [{"role": "user", "content": item}],
            "max_tokens": TOKENS, "temperature": 0, **line.get("extra", {})}
    r = requests.post(line["url"] + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {line.get('key','x')}"}, timeout=600)
    r.raise_for_status()
    j = r.json()
    return j["usage"]["completion_tokens"], j["choices"][0]["message"]["content"]

for line in LINES.values():
    for item in WARM:
        ask(line, item)
results = {}
for repeat in range(REPEATS):
    for level in LEVELS:
        names = list(LINES)
        names = names[repeat % len(names):] + names[:repeat % len(names)]
        for name in names:
            line = LINES[name]
            began = time.perf_counter()
            with ThreadPoolExecutor(level) as pool:
                out = list(pool.map(lambda item: ask(line, item), PROMPTS))
            secs = time.perf_counter() - began
            tokens = sum(t for t, _ in out)
            entry = results.setdefault(f"{name}@{level}", {"tokens": 0, "seconds": 0.0, "texts": []})
            entry["tokens"] += tokens; entry["seconds"] += secs; entry["texts"] = [t for _, t in out]
            print(f"repeat {repeat+1} {name} @{level}: {tokens/secs:.1f} tok/s", flush=True)
for key, entry in results.items():
    print(f"{key}: {entry['tokens']/entry['seconds']:.2f} tok/s over {entry['tokens']} tokens")
json.dump(results, open("/tmp/lines-results.json", "w"), indent=1)
