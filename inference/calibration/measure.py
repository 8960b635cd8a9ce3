"""What a calibration measures, in-process on the worker's host, within a budget of seconds:

1. the main alone (the library's pipeline) in each precision configuration the device offers, at one stream
   and at several at once: the fastest is the host's baseline, and every route of the main alone serves in it;
2. the own engine (engines/exact.py) in the faster configuration of those its greedy answers with the draft are
   exact in (f32 with or without dynamic quantization), at K=0 and each K: tokens/s, acceptance and identity;
3. the main's cost of one inference of n = 1..8 tokens in that configuration (what K can pay).

From these: the K a lone answer gets (0: speculation does not pay on this host, the main alone serves).
Prompts are the repository's held-out ones (nobody tuned on them), through the pair's chat template."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from inference.benchmark.modes import LOOPING, answer, infer_cost
from inference.benchmark.prompts import heldout_prompts, repeated_ngram_share
from inference.engines.precision import CONFIGS, EXACT_ON_OWN_ENGINE, PrecisionConfig, offered
from inference.engines.registry import build_engine
from inference.engines.spec import PairSpec
from inference.engines.tokenizer import load_tokenizer
from inference.limits import Drafter

Progress = Callable[[int, int, str], None]
SLOWER = 0.85  # a K this much slower than the best so far ends the sweep (beyond a run's spread)


@dataclass(frozen=True)
class Budget:
    prompts: int = 2  # held-out prompts answered one at a time (one code, one prose, ...)
    max_new_tokens: int = 48
    streams: int = 4  # answered at once, for the main alone under load
    ks: tuple[int, ...] = (1, 2, 3, 4, 5)
    cost_sizes: tuple[int, ...] = tuple(range(1, 9))
    seconds: float = 300  # no new configuration or K is started past this


def chat_prompts(main_dir: str, count: int) -> list[str]:
    """`count` held-out prompts, code and prose alternating, as the chat and the API give them to the model."""
    code, prose = heldout_prompts(sets=("code",)), heldout_prompts(sets=("prose",))
    mixed = [prompt.text for pair in zip(code, prose, strict=False) for prompt in pair][:count]
    tokenizer = load_tokenizer(main_dir)
    return [str(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True))
            for text in mixed]


def calibrate(*, spec: PairSpec, capabilities: list[str], budget: Budget, progress: Progress) -> dict:
    """The figures a HostCalibration keeps (see the module's docstring)."""
    started = time.monotonic()
    configs = offered(capabilities)
    prompts = chat_prompts(spec.main_dir, max(budget.prompts, budget.streams))
    steps = Steps(total=len(configs) + (len(budget.ks) + 2 if spec.draft_dir else 0), report=progress)
    results: dict = {"budget": vars(budget) | {"ks": list(budget.ks), "cost_sizes": list(budget.cost_sizes)},
                     "prompts": prompts[:budget.prompts], "configs": {}, "skipped": []}
    for config in configs:
        if time.monotonic() - started > budget.seconds and results["configs"]:
            results["skipped"].append(f"main alone in {config.name}")
            continue
        steps.next(f"the main alone in {config.label}")
        results["configs"][config.name] = _main_alone(spec, config, prompts=prompts, budget=budget)
    ranked = sorted(results["configs"], key=lambda name: results["configs"][name]["tokens_per_s"], reverse=True)
    results["fastest"] = ranked[0]
    results["own_config"] = ""
    if spec.draft_dir:  # in the faster of the configurations it is exact in
        own = next(name for name in [*ranked, *EXACT_ON_OWN_ENGINE] if name in EXACT_ON_OWN_ENGINE)
        results.update(_own_in(spec, own, prompts=prompts, budget=budget, started=started, progress=steps.next))
    results["best_k"] = {"1": best_k(results)} if results.get("ks") else {}  # none: out of time before any K
    results["library_alone"] = library_alone(results)
    results["seconds"] = round(time.monotonic() - started, 1)
    progress(steps.total, steps.total, "done")
    return results


@dataclass
class Steps:
    """The calibration's progress: each measurement started counts one step of `total`."""

    total: int
    report: Progress
    done: int = 0

    def next(self, label: str) -> None:
        self.report(min(self.done, self.total - 1), self.total, label)
        self.done += 1


def best_k(results: dict) -> int:
    """The K a lone answer is fastest with, 0 when no K beats the fastest main alone measured here."""
    alone = max([line["tokens_per_s"] for line in results["configs"].values()]
                + [results.get("own_main_alone", {}).get("tokens_per_s", 0.0)])
    drafted = {int(k): line["tokens_per_s"] for k, line in results.get("ks", {}).items()
               if line["identical"] == line["answers"]}
    k = max(drafted, key=drafted.__getitem__, default=0)
    return k if k and drafted[k] > alone else 0


# The main alone leaves the own engine's batch for the library's pipeline (a second copy of its weights) only
# where the library's was this much faster (beyond a run's spread).
LIBRARY_MARGIN = 1.05


def library_alone(results: dict) -> dict[str, bool]:
    """{streams: whether the library's main alone, in the configuration it serves in, beat the own engine's}."""
    own, fastest = results.get("own_main_alone"), results["configs"][results["fastest"]]
    if not own:
        return {}
    return {"1": fastest["tokens_per_s"] > LIBRARY_MARGIN * own["tokens_per_s"],
            str(fastest["streams"]): fastest["tokens_per_s_streams"] > LIBRARY_MARGIN * own["tokens_per_s_streams"]}


def _main_alone(spec: PairSpec, config: PrecisionConfig, *, prompts: list[str], budget: Budget) -> dict:
    engine = build_engine(replace(spec, speculative=False, exact_sampling=False, own_engine=False, **config.fields))
    try:
        answer(engine, prompts[0], k=0, max_new_tokens=4)  # untimed: the first inference repacks the weights
        one = _rate(engine, prompts[:budget.prompts], k=0, streams=1, max_new_tokens=budget.max_new_tokens)
        many = _rate(engine, prompts[:budget.streams], k=0, streams=budget.streams,
                     max_new_tokens=budget.max_new_tokens)
    finally:
        engine.close()
    return {"label": config.label, "tokens_per_s": one["tokens_per_s"], "streams": budget.streams,
            "tokens_per_s_streams": many["tokens_per_s"], "looping": one["looping"]}


def _own_in(spec: PairSpec, name: str, *, prompts: list[str], budget: Budget, started: float,
            progress: Callable[[str], None]) -> dict:
    all_prompts, prompts = prompts, prompts[:budget.prompts]
    config = CONFIGS[name]
    own = replace(spec, speculative=True, exact_sampling=True, own_engine=True, speculating_streams=0,
                  prompt_cache_tokens=0, **config.fields)
    engine = build_engine(own)
    try:
        progress(f"the own engine in {config.label}: the main alone")
        answer(engine, prompts[0], k=budget.ks[0], max_new_tokens=4)  # untimed warm-up of both models
        alone = _rate(engine, prompts, k=0, streams=1, max_new_tokens=budget.max_new_tokens)
        alone["tokens_per_s_streams"] = _rate(engine, all_prompts[:budget.streams], k=0, streams=budget.streams,
                                              max_new_tokens=budget.max_new_tokens)["tokens_per_s"]
        ks: dict[str, dict] = {}
        for k in budget.ks:
            if time.monotonic() - started > budget.seconds:
                break
            progress(f"the own engine in {config.label}: K={k}")
            line = _rate(engine, prompts, k=k, streams=1, max_new_tokens=budget.max_new_tokens)
            line["identical"] = sum(mine == theirs for mine, theirs in zip(line.pop("answers_tokens"),
                                                                           alone["answers_tokens"], strict=True))
            ks[str(k)] = line
            if line["tokens_per_s"] < SLOWER * max(each["tokens_per_s"] for each in ks.values()):
                break  # past the best K: a longer verify costs more than it brings
    finally:
        engine.close()
    progress(f"the main's cost of verifying 1-{budget.cost_sizes[-1]} tokens in {config.label}")
    props = replace(spec, **config.fields).device_properties(device=spec.device)
    costs = infer_cost(main_dir=spec.main_dir, props=props, device=spec.device, sizes=budget.cost_sizes, repeats=8)
    alone.pop("answers_tokens")
    return {"own_config": name, "own_main_alone": alone, "ks": ks,
            "verify_cost": {str(n): round(ms / costs[1], 3) for n, ms in costs.items()},
            "verify_ms": round(costs[1], 2)}


def _rate(engine, prompts: list[str], *, k: int, streams: int, max_new_tokens: int) -> dict:
    """Tokens/s of answering `prompts` `streams` at a time at K (0: the main alone), with acceptance."""
    began = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        answers = list(pool.map(lambda text: answer(engine, text, k=k, max_new_tokens=max_new_tokens), prompts))
    seconds = time.perf_counter() - began
    tokens = sum(len(ids) for ids, _, _ in answers)
    proposed = sum(stats.proposed for _, _, stats in answers)
    accepted = sum(stats.accepted for _, _, stats in answers)
    looked_up = [drafted for _, _, stats in answers if (drafted := stats.by_drafter.get(Drafter.NGRAM))]
    return {"tokens_per_s": round(tokens / seconds, 2), "answers": len(answers),
            "acceptance": round(accepted / proposed, 3) if k and proposed else None,
            "lookup_share": round(sum(d.proposed for d in looked_up) / proposed, 3) if k and proposed else None,
            "looping": sum(repeated_ngram_share(engine.tokenizer.decode(ids)) > LOOPING for ids, _, _ in answers),
            "answers_tokens": [ids for ids, _, _ in answers]}
