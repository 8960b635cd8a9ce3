"""The script behind docs/speculation.md's "Where the draft stops": replays the main's greedy answers with the draft
teacher-forced (what the draft proposes after an accepted run is what it predicts on the main's own text), and with
the costs timed here — a draft token, a verify of n tokens — prices every policy for a step's length: a fixed K, or
up to K_MAX tokens while the draft's probability of its own token stays at or above a threshold. Greedy: a step's
outcome is exactly what the replay says; the seconds are the cost model's.

Usage: DJANGO_SETTINGS_MODULE=chatsite.settings python draft_stop.py PAIR TUNE_JSON HELDOUT_JSON [TOKENS [DRAFT_DIR]]"""
import sys
import time
from dataclasses import replace
from pathlib import Path
from statistics import median

import django

django.setup()

import numpy as np  # noqa: E402

from inference.benchmark.modes import answer  # noqa: E402
from inference.benchmark.prompts import prompts_from_file  # noqa: E402
from inference.engines.own.engine import OwnEngine  # noqa: E402
from inference.engines.own.kv_cache import KvSequence  # noqa: E402
from inference.engines.tokenizer import load_tokenizer, prompt_token_ids  # noqa: E402
from inference.models import ModelPair  # noqa: E402
from inference.serving.records import pair_spec  # noqa: E402

SLUG, TUNE, HELDOUT = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
TOKENS = int(sys.argv[4]) if len(sys.argv) > 4 else 128
THRESHOLDS = (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
K_MAXES = (1, 2, 3, 4, 5, 6, 8)

spec = replace(pair_spec(pair=ModelPair.objects.get(slug=SLUG)), prompt_cache_tokens=0)
if len(sys.argv) > 5:  # another IR of the draft (its head cut to the same tokens)
    spec = replace(spec, draft_dir=sys.argv[5])
engine = OwnEngine(spec)
tokenizer = load_tokenizer(spec.main_dir)


def rendered(path: Path) -> list[str]:
    return [p.text for p in prompts_from_file(path, render_chat=lambda messages: str(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True)))]


def replayed(prompt: str) -> tuple[np.ndarray, np.ndarray]:
    """Per answer token: whether the draft's argmax is the main's token, and the draft's probability of its argmax."""
    tokens, _, _ = answer(engine, prompt, k=0, max_new_tokens=TOKENS)
    ids = prompt_token_ids(tokenizer, prompt=prompt, add_special_tokens=False, prompt_ids=None)
    draft = KvSequence(engine.draft)  # every fed token's row, over the tokens the draft's head keeps
    cut = np.vstack([draft.prefill(ids), draft.feed(tokens[:-1])])
    rows = np.vstack([engine.draft_head.widen(row) for row in cut]) if engine.draft_head else cut
    top = rows.argmax(axis=1)
    shifted = rows - rows.max(axis=1, keepdims=True)
    confidence = 1.0 / np.exp(shifted).sum(axis=1)
    return top == np.array(tokens), confidence


def timed(sequence: KvSequence, n: int, rounds: int = 12) -> float:
    """Median seconds of one inference of n tokens after a 200-token context, the cache cut back each time."""
    sequence.prefill(list(range(1000, 1200)))
    seconds = []
    for _ in range(rounds):
        started = time.perf_counter()
        sequence.feed(list(range(2000, 2000 + n)))
        seconds.append(time.perf_counter() - started)
        sequence.drop_last(n)
    return median(seconds)


def cost_model() -> tuple[float, dict[int, float]]:
    """A draft token's seconds and the main's verify of n = 1..K_MAX+1 tokens, in seconds."""
    main = KvSequence(engine.main, cut_rejected=True)
    verify = {n: timed(main, n) for n in range(1, max(K_MAXES) + 2)}
    return timed(engine.draft_sequence(), 1), verify


def priced(answers, *, k_max: int, threshold: float, draft_s: float, verify: dict[int, float]) -> tuple[float, float]:
    """Tokens a second and tokens a step, every answer replayed with this policy."""
    tokens = seconds = steps = 0.0
    for agree, confidence in answers:
        i = 0
        while i < len(agree):
            # The draft proposes without knowing which tokens the main will keep: up to k_max, or until its
            # probability falls below the threshold (that inference counted, its token held back). Its
            # probabilities after the first rejected token are on its own text; the main's are the stand-in.
            proposed = drafted = 0
            while proposed < k_max and i + proposed < len(agree):
                drafted += 1
                if confidence[i + proposed] < threshold:
                    break
                proposed += 1
            accepted = next((j for j in range(proposed) if not agree[i + j]), proposed)
            delivered = min(accepted + 1, len(agree) - i)
            tokens, steps = tokens + delivered, steps + 1
            seconds += drafted * draft_s + verify[proposed + 1]
            i += delivered
    return tokens / seconds, tokens / steps


def table(name: str, answers, draft_s: float, verify: dict[int, float]) -> None:
    alone = 1.0 / verify[1]
    print(f"\n{name}: {sum(len(a) for a, _ in answers)} tokens, draft acceptance "
          f"{np.mean(np.concatenate([a for a, _ in answers])):.3f}; x the main alone ({alone:.1f} tok/s) "
          f"[tokens a step]")
    print("| K_MAX | " + " | ".join(f"p >= {t}" for t in THRESHOLDS) + " |")
    print("| ---: |" + " ---: |" * len(THRESHOLDS))
    for k_max in K_MAXES:
        cells = []
        for threshold in THRESHOLDS:
            speed, per_step = priced(answers, k_max=k_max, threshold=threshold, draft_s=draft_s, verify=verify)
            cells.append(f"{speed / alone:.3f} [{per_step:.2f}]")
        print(f"| {k_max} | " + " | ".join(cells) + " |")


draft_s, verify = cost_model()
print(f"c = {draft_s / verify[1]:.3f} (draft token {1000 * draft_s:.1f} ms, main token {1000 * verify[1]:.1f} ms); "
      "verify n/1: " + " ".join(f"{n}:{verify[n] / verify[1]:.2f}" for n in sorted(verify)))
for path in (TUNE, HELDOUT):
    table(path.name, [replayed(prompt) for prompt in rendered(path)], draft_s, verify)
