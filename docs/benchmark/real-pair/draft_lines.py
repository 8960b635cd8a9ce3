"""The script behind docs/benchmark.md's "The draft's precision" and docs/speculation.md's "Drafters that do not pay"
tables: on the pair's own engine (f32 with the CPU's int8 activations, in-process), the main alone and K=3 with each
draft IR given, its drafters proposing every step ("fixed") or sitting out where they do not pay ("judged",
engines/own/payoff.py), answers interleaved prompt by prompt, the order turned each prompt and round.

Usage: DJANGO_SETTINGS_MODULE=chatsite.settings python draft_lines.py PAIR PROMPTS_JSON TEMPERATURE DRAFT_DIR...
(each DRAFT_DIR an IR folder with head_vocabulary.npy beside it, as `make real-pair` writes)."""
import sys
from dataclasses import replace
from pathlib import Path

import django

django.setup()

from inference.benchmark.modes import answer  # noqa: E402
from inference.benchmark.prompts import prompts_from_file  # noqa: E402
from inference.engines.decoding import Speculation  # noqa: E402
from inference.engines.own.engine import OwnEngine  # noqa: E402
from inference.engines.tokenizer import load_tokenizer  # noqa: E402
from inference.limits import Route  # noqa: E402
from inference.models import ModelPair  # noqa: E402
from inference.serving.records import pair_spec  # noqa: E402

SLUG, PROMPTS, TEMPERATURE, DRAFTS = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
ROUNDS, TOKENS, K = 2, 96, 3

spec = replace(pair_spec(pair=ModelPair.objects.get(slug=SLUG)), route=Route.OWN_SPECULATIVE,
               dynamic_quantization=True, inference_precision="f32", kv_cache_precision="f32", prompt_cache_tokens=0)
tokenizer = load_tokenizer(spec.main_dir)
prompts = [p.text for p in prompts_from_file(PROMPTS, render_chat=lambda messages: str(
    tokenizer.apply_chat_template(messages, add_generation_prompt=True)))]
engines, lines = {}, [("main alone", None, 0)]
for draft in DRAFTS:
    for judged in (False, True):
        name = f"{Path(draft).name} {'judged' if judged else 'fixed'} K={K}"
        engines[name] = OwnEngine(replace(spec, slug=name, draft_dir=draft, drafters_judged=judged,
                                          draft_head_ids=str(Path(draft, "head_vocabulary.npy"))))
        lines.append((name, name, K))
engines[None] = next(iter(engines.values()))
figures = {name: {"tokens": 0, "seconds": 0.0, "accepted": 0, "proposed": 0, "undrafted": 0, "steps": 0,
                  "identical": 0} for name, _, _ in lines}
for name, engine, k in lines:
    answer(engines[engine], prompts[0], speculation=Speculation(k=k) if k else None, max_new_tokens=16)  # warm up
for round_ in range(ROUNDS):
    for index, prompt in enumerate(prompts):
        answers = {}
        for name, engine, k in (lines if (index + round_) % 2 == 0 else lines[::-1]):
            tokens, seconds, stats = answer(engines[engine], prompt, speculation=Speculation(k=k) if k else None,
                                            max_new_tokens=TOKENS, temperature=TEMPERATURE, seed=index)
            line = figures[name]
            line["tokens"] += len(tokens)
            line["seconds"] += seconds
            line["accepted"] += stats.accepted
            line["proposed"] += stats.proposed
            line["undrafted"] += stats.undrafted_steps
            line["steps"] += stats.main_steps
            answers[name] = tokens
        for name, tokens in answers.items():
            figures[name]["identical"] += tokens == answers["main alone"]
alone = figures["main alone"]["tokens"] / figures["main alone"]["seconds"]
print("| line | tok/s | vs the main alone | acceptance | steps nothing proposed | identical |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for name, line in figures.items():
    rate = line["tokens"] / line["seconds"]
    acceptance = f"{line['accepted'] / line['proposed']:.2f}" if line["proposed"] else "-"
    print(f"| {name} | {rate:.1f} | {rate / alone:.2f}x | {acceptance} | {line['undrafted']}/{line['steps']} | "
          f"{line['identical']}/{ROUNDS * len(prompts)} |")
