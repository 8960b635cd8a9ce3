"""The script behind docs/speculation.md's "A K per answer": on the pair's own engine as a worker on this host serves a
lone answer (its calibrated configuration, draft format and K), the main alone, the calibrated K at every step (the
draft stopping where unsure if the calibration measured that K so, as a worker then serves it), and the same K
lowered per answer from its own acceptance at the host's calibrated costs (engines/own/step_length.py), answers
interleaved prompt by prompt, the order turned each prompt and round. Needs the pair calibrated here.

Usage: DJANGO_SETTINGS_MODULE=chatsite.settings python k_per_answer.py PAIR PROMPTS_JSON TEMPERATURE [ROUNDS]"""
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
from inference.serving.calibrated import host_figures  # noqa: E402
from inference.serving.host import this_host  # noqa: E402
from inference.serving.records import pair_spec  # noqa: E402

SLUG, PROMPTS, TEMPERATURE = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
ROUNDS, TOKENS = int(sys.argv[4]) if len(sys.argv) > 4 else 2, 96

pair = ModelPair.objects.get(slug=SLUG)
figures = host_figures(pair=pair, host=this_host(pair.runs_on))
K = figures.k_at(1)
assert K and figures.step_costs, f"calibrate {SLUG} on this host first (a K and the costs timed): {figures}"
engine = OwnEngine(replace(pair_spec(pair=pair, route=Route.OWN_SPECULATIVE, calibration=figures),
                           prompt_cache_tokens=0))
tokenizer = load_tokenizer(engine.spec.main_dir)
prompts = [p.text for p in prompts_from_file(PROMPTS, render_chat=lambda messages: str(
    tokenizer.apply_chat_template(messages, add_generation_prompt=True)))]
STOP = figures.draft_stop_below  # the calibrated K was measured with the draft stopping where unsure
stopping = f", stop below {STOP}" if STOP else ""
lines = [("main alone", 0, (), None), (f"K={K} every step{stopping}", K, (), STOP),
         (f"K<={K} per answer", K, figures.step_costs, None)]
stats_of = {name: {"tokens": 0, "seconds": 0.0, "accepted": 0, "proposed": 0, "drafted": 0, "identical": 0}
            for name, *_ in lines}
def speculation(k: int, costs: tuple[float, ...], stop: float | None) -> Speculation | None:
    return Speculation(k=k, step_costs=costs, draft_stop_below=stop) if k else None


for _, k, costs, stop in lines:
    answer(engine, prompts[0], speculation=speculation(k, costs, stop), max_new_tokens=16)  # warm-up
for round_ in range(ROUNDS):
    for index, prompt in enumerate(prompts):
        answers = {}
        for name, k, costs, stop in (lines if (index + round_) % 2 == 0 else lines[::-1]):
            tokens, seconds, stats = answer(engine, prompt, speculation=speculation(k, costs, stop),
                                            max_new_tokens=TOKENS, temperature=TEMPERATURE, seed=index)
            line = stats_of[name]
            line["tokens"] += len(tokens)
            line["seconds"] += seconds
            line["accepted"] += stats.accepted
            line["proposed"] += stats.proposed
            line["drafted"] += stats.draft_steps
            answers[name] = tokens
        for name, tokens in answers.items():
            stats_of[name]["identical"] += tokens == answers["main alone"]
print(f"{figures.host}; costs (a draft token, verifying 2..n tokens, x one main token): {figures.step_costs}")
alone = stats_of["main alone"]["tokens"] / stats_of["main alone"]["seconds"]
print("| line | tok/s | vs the main alone | acceptance | tokens proposed a drafted step | identical |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for name, line in stats_of.items():
    rate = line["tokens"] / line["seconds"]
    acceptance = f"{line['accepted'] / line['proposed']:.2f}" if line["proposed"] else "-"
    length = f"{line['proposed'] / line['drafted']:.2f}" if line["drafted"] else "-"
    print(f"| {name} | {rate:.1f} | {rate / alone:.2f}x | {acceptance} | {length} | "
          f"{line['identical']}/{ROUNDS * len(prompts)} |")
