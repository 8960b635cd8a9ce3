"""How often the prefix cache changes the main's answer: a follow-up read from kept blocks (its history's prompts and
the answers' decoded keys and values, as the server keeps them) against the same prompt prefilled cold.

For each held-out conversation (conversations.json) the server's own path answers every turn (the own engine, greedy,
K as the host calibrated), keeping its blocks. At each follow-up the main then reads the prompt twice, warm (from
those blocks) and cold (no cache), and both are fed the warm answer's tokens one at a time (teacher-forced): printed,
the share of positions whose most likely token agrees, the first position where it does not, and the largest gap
between the two logits of a position.

    DJANGO_DEBUG=1 .venv/bin/python docs/benchmark/real-pair/warm_vs_cold.py [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
django.setup()

import numpy as np  # noqa: E402

from inference.engines.decoding import DecodingParams  # noqa: E402
from inference.engines.interface import Finished, StepTokens  # noqa: E402
from inference.engines.own.engine import OwnEngine  # noqa: E402
from inference.engines.own.kv_cache import KvSequence  # noqa: E402
from inference.engines.own.prefix_cache import PrefixCache  # noqa: E402
from inference.limits import Route  # noqa: E402
from inference.models import ModelPair  # noqa: E402
from inference.serving.calibrated import host_figures  # noqa: E402
from inference.serving.host import this_host  # noqa: E402
from inference.serving.records import pair_spec  # noqa: E402

HERE = Path(__file__).parent


def argmaxes(sequence: KvSequence, prompt: list[int], answer: list[int]) -> tuple[list[int], list[np.ndarray]]:
    rows = [sequence.prefill(prompt)[-1].copy()]
    for token in answer[:-1]:
        rows.append(sequence.feed([token])[-1].copy())
    sequence.close()
    return [int(np.argmax(row)) for row in rows], rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    pair = ModelPair.objects.get(slug="qwen2.5-coder-1.5b")
    figures = host_figures(pair=pair, host=this_host(pair.runs_on))
    engine = OwnEngine(pair_spec(pair=pair, route=Route.OWN_SPECULATIVE, calibration=figures))
    k = figures.best_k.get(1, 4) if figures.calibrated else 4
    tokenizer = engine.tokenizer
    print(f"host: {this_host().described}; the own engine at K={k}, greedy, {args.tokens} tokens a turn")
    agreed = positions = parted = 0
    for conversation in json.loads((HERE / "conversations.json").read_text()):
        messages = [{"role": "system", "content": conversation["system"]}]
        for turn, text in enumerate(conversation["turns"]):
            messages.append({"role": "user", "content": text})
            rendered = str(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
            prompt = tokenizer.encode(rendered, add_special_tokens=False).input_ids.data[0].tolist()
            request = engine.submit(prompt_ids=prompt, params=DecodingParams(max_new_tokens=args.tokens,
                                                                            num_assistant_tokens=k))
            answer: list[int] = []
            while not isinstance(event := request.next_step(timeout=600), Finished):
                if isinstance(event, StepTokens):
                    answer += event.token_ids
            if turn:
                warm, warm_rows = argmaxes(KvSequence(engine.main, prompts=engine.main_prompts, cut_rejected=True),
                                           prompt, answer)
                cold, cold_rows = argmaxes(KvSequence(engine.main, prompts=PrefixCache(capacity_bytes=0),
                                                      cut_rejected=True), prompt, answer)
                same = [a == b for a, b in zip(warm, cold, strict=True)]
                first = same.index(False) if False in same else None
                gap = max(float(np.abs(a - b).max()) for a, b in zip(warm_rows, cold_rows, strict=True))
                agreed, positions, parted = agreed + sum(same), positions + len(same), parted + (first is not None)
                print(f"{conversation['name']} turn {turn}: prompt {len(prompt)} tokens ({request.cached_tokens} from "
                      f"the cache); top-1 agrees at {sum(same)}/{len(same)}; first differing position "
                      f"{first if first is not None else '-'}; largest logit gap {gap:.3f}", flush=True)
            messages.append({"role": "assistant", "content": tokenizer.decode(answer)})
    print(f"all follow-ups: top-1 agrees at {agreed}/{positions} positions ({agreed / positions:.2%}); "
          f"{parted} follow-ups with a differing position")


if __name__ == "__main__":
    main()
