"""A pair's precision modes, each against every mode's main alone: what speculation buys in the exact mode
(f32 activations and KV cache, no dynamic quantization: greedy answers identical to the main alone's), in
the fast modes (the device's defaults; f32 with int8 activations; where near-ties can flip between one
token and K+1 verified at once) and on the pair's own engine (f32 with int8 activations, exact), and what
one inference of n tokens costs the main in each (the curve that decides which K can pay).

Every line runs in-process on the product's engines (engines/library/pipeline.py, engines/own/engine.py), first one
untimed round (warm-up), then interleaved prompt by prompt with the order turned each repeat, and is compared as ratios
within the run. Answers end at the model's EOS (real answers, not a fixed count), and each line says how many answers
loop."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from statistics import median

import numpy as np
import openvino as ov

from inference.benchmark.prompts import repeated_ngram_share
from inference.engines.decoding import DecodingParams, Speculation
from inference.engines.grammar.grammar import Grammar
from inference.engines.interface import Engine, Finished
from inference.engines.own.draft_head import DraftHead, compile_draft
from inference.engines.own.engine import own_engine_precision, steady_rows
from inference.engines.own.kv_cache import PagedModel, PagedSequence
from inference.engines.own.model_runner import ModelRunner
from inference.engines.own.paged_model import read_paged
from inference.engines.spec import PairSpec, library_route
from inference.engines.speculation_stats import SpeculationStats
from inference.limits import Drafter, FinishReason, Route
from inference.serving.registry import build_engine

# Each mode as PairSpec fields ("" precision: the device's default). fast-f32: f32 with the CPU's dynamic int8
# activations, the fastest main alone on some hosts, where the library's speculation is not exact; own: the same
# numbers on the pair's own engine (engines/own/engine.py), where it is.
EXACT = {"inference_precision": "f32", "kv_cache_precision": "f32"}
MODES: dict[str, dict] = {
    "exact": EXACT,
    "fast": {"inference_precision": "", "kv_cache_precision": ""},
    "fast-f32": {**EXACT, "dynamic_quantization": True},
    "own": {**EXACT, "dynamic_quantization": True, "route": Route.OWN_SPECULATIVE},
}
MODES["own-whole-head"] = {**MODES["own"], "draft_head_ids": ""}  # the own engine's draft with its head whole
MODES["own-fixed-k"] = {**MODES["own"], "drafters_judged": False}  # every step proposes K, paying or not
DEFAULT_MODES = ("exact", "fast", "fast-f32", "own")
LOOPING = 0.5  # an answer whose 4-grams are mostly repeats is stuck in a loop


@dataclass(kw_only=True)
class Tally:
    """What a measured line's answers add up to: the benchmark's modes and the calibration keep one per line."""

    tokens: int = 0
    seconds: float = 0.0  # wall time of the line's rounds, each round's answers at once
    answers: list[list[int]] = field(default_factory=list)  # token ids
    first_token_s: list[float] = field(default_factory=list)  # each answer's, from its submission
    looping: int = 0
    steps: int = 0
    undrafted: int = 0  # steps with nothing proposed: the drafters sat out where they did not pay (own/payoff.py)
    proposed: int = 0
    accepted: int = 0
    ngram_steps: int = 0
    ngram_proposed: int = 0
    ngram_accepted: int = 0

    def run_round(self, engine: Engine, prompts: list[str], settings: Callable[[int], dict]) -> list[list[int]]:
        """`prompts` answered at once, a thread each, the index-th with `answer`'s keywords `settings(index)`;
        their token ids, and the tally takes them in."""
        def timed(index: int) -> tuple[list[int], SpeculationStats, float]:
            submitted = time.perf_counter()
            ids, _, stats = answer(engine, prompts[index], **settings(index))
            return ids, stats, (stats.first_token_at or submitted) - submitted

        started = time.perf_counter()
        with ThreadPoolExecutor(len(prompts)) as pool:
            done = list(pool.map(timed, range(len(prompts))))
        self.seconds += time.perf_counter() - started
        for ids, stats, first_token_s in done:
            self.tokens += len(ids)
            self.answers.append(ids)
            self.first_token_s.append(first_token_s)
            self.looping += repeated_ngram_share(engine.tokenizer.decode(ids)) > LOOPING
            self.steps += stats.draft_steps + stats.undrafted_steps
            self.undrafted += stats.undrafted_steps
            self.accepted += stats.accepted
            self.proposed += stats.proposed
            if ngram := stats.by_drafter.get(Drafter.NGRAM):
                self.ngram_steps += ngram.steps
                self.ngram_proposed += ngram.proposed
                self.ngram_accepted += ngram.accepted
        return [ids for ids, _, _ in done]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def first_token_ms(self) -> float | None:
        """The median answer's time to its first token."""
        return round(1000 * median(self.first_token_s), 1) if self.first_token_s else None


@dataclass
class Line(Tally):
    mode: str
    k: int  # 0: the main alone
    identical: int = 0
    speculating: int = 0  # >0: only that many answers of a round speculate on their own, the rest in the batch
    batch_k: int = 0  # with `speculating`: the rest speculate at K in the batch (0: the main alone, as a pair ships)
    lookup: bool = True  # on the own engine: the prompt lookup proposes before the draft

    @property
    def name(self) -> str:
        if self.speculating and self.batch_k:
            return f"{self.mode} K={self.k} in the batch beyond {self.speculating}"
        if self.speculating:
            return f"{self.mode} as shipped (K={self.k} for {self.speculating}, the rest the main alone)"
        return f"{self.mode} {'main alone' if not self.k else f'K={self.k}'}{'' if self.lookup else ' draft only'}"

    def speculation_of(self, index: int) -> Speculation | None:
        """How a round's index-th answer speculates (None: the main alone)."""
        k = self.k if not self.speculating or self.batch_k or index < self.speculating else 0
        return Speculation(k=k, batch_k=self.batch_k or None) if k else None


def mode_spec(spec: PairSpec, mode: str, *, speculative: bool, speculating_streams: int = 0,
              lookup: bool = True) -> PairSpec:
    """`speculating_streams`: on the own engine, beyond that many answers speculating ones join the batch (0:
    never, every answer speculates, the lines that show what speculating alone costs under load). `lookup`: the
    own engine's prompt lookup before its draft (off: the draft alone proposes)."""
    fields = {"route": library_route(spec, speculative=speculative), "dynamic_quantization": False, **MODES[mode]}
    return replace(spec, speculating_streams=speculating_streams, chained_lookup=lookup, **fields)


def answer(engine: Engine, prompt: str, *, speculation: Speculation | None, max_new_tokens: int,
           grammar: Grammar | None = None, temperature: float = 0.0, seed: int = 0
           ) -> tuple[list[int], float, SpeculationStats]:
    """Token ids, seconds from submit to the end, and the steps' figures."""
    started = time.perf_counter()
    request = engine.submit(prompt=prompt, add_special_tokens=False,
                            params=DecodingParams(max_new_tokens=max_new_tokens, speculation=speculation,
                                                  temperature=temperature, seed=seed,
                                                  grammar_kind=grammar.kind if grammar else "",
                                                  grammar_text=grammar.text if grammar else ""))
    stats = SpeculationStats(num_assistant_tokens=speculation.k if speculation else None,
                             speculative=speculation is not None, max_new_tokens=max_new_tokens)
    tokens: list[int] = []
    while not isinstance(event := request.next_step(timeout=600), Finished):
        tokens += event.token_ids
        stats.add_step(len(event.token_ids), event.at, drafter=event.drafter, proposed=event.proposed)
    if event.finish_reason not in {FinishReason.STOP, FinishReason.LENGTH}:
        raise RuntimeError(f"an answer failed: {event.error}")
    return tokens, time.perf_counter() - started, stats


def compare_modes(*, spec: PairSpec, prompts: list[str], ks: tuple[int, ...], max_new_tokens: int,
                  repeats: int, modes: tuple[str, ...] = tuple(MODES), grammar: Grammar | None = None,
                  streams: int = 1, own_engine_streams: int = 0, batch_ks: tuple[int, ...] = (),
                  draft_only: bool = False, temperature: float = 0.0, say=print) -> list[Line]:
    """`grammar`: every answer held to it (structured output), with and without the draft. `streams`: that
    many prompts answered at once by each line (the library batches them; the own engine runs a thread for
    each, but its answers on the main alone share one batch), and tokens/s is their sum over the wall time. With more
    streams than the pair's `own_engine_streams`, an "own as shipped" line runs them as the pair serves a
    burst: that many speculate, the rest run on the main alone, batched (serving/planning, Route.OWN_MAIN_ALONE),
    and so do the speculating ones once the others have come (engines/own/engine.py); `batch_ks`: lines where the
    rest speculate in the batch at each of these Ks instead (Speculation.batch_k). `draft_only`: each own K also
    with the prompt lookup off. `temperature` > 0: sampled answers (seeded; identical then means little)."""
    lines = [Line(mode, k) for mode in modes for k in (0, *ks)]
    if "own" in modes and 0 < own_engine_streams < streams:
        lines += [Line("own", k, speculating=own_engine_streams) for k in ks]
        lines += [Line("own", k, speculating=own_engine_streams, batch_k=k) for k in batch_ks]
    if "own" in modes and draft_only:
        lines += [Line("own", k, lookup=False) for k in ks]
    specs = {line.name: mode_spec(spec, line.mode, speculative=bool(line.k), speculating_streams=line.speculating,
                                  lookup=line.lookup) for line in lines}
    built = {each: build_engine(each) for each in set(specs.values())}  # the own engine serves its main alone and K
    engines = {name: built[each] for name, each in specs.items()}
    rounds = [prompts[start:start + streams] for start in range(0, len(prompts), streams)]
    try:
        for line in lines:  # untimed: an engine's first inferences of each shape repack its weights for them
            _run_round(replace(line, answers=[], first_token_s=[]), engines[line.name], rounds[0],
                       max_new_tokens=max_new_tokens, grammar=grammar, temperature=temperature)
        for repeat in range(repeats):
            for index, together in enumerate(rounds):
                order = lines[(repeat + index) % len(lines):] + lines[:(repeat + index) % len(lines)]
                texts: dict[str, list[list[int]]] = {}
                for line in order:
                    engine = engines[line.name]
                    texts[line.name] = _run_round(line, engine, together, max_new_tokens=max_new_tokens,
                                                  grammar=grammar, temperature=temperature)
                for line in lines:
                    line.identical += sum(mine == alone for mine, alone in
                                          zip(texts[line.name], texts[f"{line.mode} main alone"], strict=True))
                say(f"repeat {repeat + 1}/{repeats}, round {index + 1}/{len(rounds)}: " + ", ".join(
                    f"{line.name} {line.tokens_per_s:.1f}" for line in lines))
    finally:
        for engine in built.values():
            engine.close()
    return lines


def _run_round(line: Line, engine: Engine, prompts: list[str], *, max_new_tokens: int,
               grammar: Grammar | None, temperature: float) -> list[list[int]]:
    """The line's answers to `prompts`, all at once; its figures take them in."""
    return line.run_round(engine, prompts, lambda index: {
        "speculation": line.speculation_of(index), "max_new_tokens": max_new_tokens, "grammar": grammar,
        "temperature": temperature, "seed": index})


def mode_props(*, main_dir: str, mode: str) -> dict[str, str]:
    """A mode's device properties (what infer_cost compiles the main with)."""
    compiled = {key: value for key, value in MODES[mode].items() if key != "route"}  # the main's, on either engine
    return PairSpec(slug="cost", main_dir=main_dir, route=Route.LIBRARY_MAIN_ALONE, **compiled).device_properties(
        device="CPU")


MEASURING_POOL_BYTES = 512 * 2**20  # the costs' own pools: a few sequences of a few thousand tokens


def infer_cost(*, main_dir: str, props: dict[str, str], device: str = "CPU",
               sizes: tuple[int, ...] = tuple(range(1, 13)), context: int = 256, repeats: int = 12,
               rows: int = 1, main_rows: str = "auto") -> dict[int, float]:
    """Median ms of one inference of n new tokens after `context` tokens (the PagedAttention op as the own engine
    runs it, compiled with `props`, its rows arranged as `main_rows` asks: the main alone's token as it computes it,
    a verify of n as it does): the cost of verifying K = n - 1 draft tokens, for `rows` answers at once (one
    inference of that many sequences, n tokens each)."""
    core = ov.Core()
    model = measuring_model(core.compile_model(read_paged(core, main_dir), device, props), main_dir=main_dir,
                            properties=props, main_rows=main_rows)
    rng = np.random.default_rng(0)
    sequences = [model.sequence(exact=True) for _ in range(rows)]
    for sequence in sequences:
        sequence.prefill(rng.integers(100, 20_000, size=context).tolist())
        sequence.reserve(context + max(sizes))
    costs: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):  # sizes interleaved, so drift hits all alike; each verify taken back (free)
        for n in sizes:
            works = [sequence.work(rng.integers(100, 20_000, size=n).tolist()) for sequence in sequences]
            began = time.perf_counter()
            model.runner.run(works)
            costs[n].append(time.perf_counter() - began)
    return {n: statistics.median(values) * 1000 for n, values in costs.items()}


def measuring_model(compiled: ov.CompiledModel, *, head: DraftHead | None = None, main_dir: str = "",
                    properties: dict[str, str] | None = None, main_rows: str = "auto") -> PagedModel:
    """A compiled model (a draft with its cut `head`) with a small pool of its own, nothing cached: what a cost is
    measured on. A main's (`main_dir`, compiled with `properties`) arranges and pads its steps as the engine does
    (steady_rows, `main_rows` as SPECCHAT_MAIN_ROWS asks)."""
    runner = ModelRunner(compiled, pool_bytes=MEASURING_POOL_BYTES)
    if main_dir:
        runner.steady = steady_rows(runner, main_dir=main_dir, properties=properties or {}, asked=main_rows)
    return PagedModel(runner, head=head, caching=False)


def draft_cost(*, spec: PairSpec, mode: str, context: int = 256, tokens: int = 64) -> dict[str, float]:
    """Median ms of one token of the main, of the draft with its head whole and of the draft with its head cut to
    the pair's list (engines/own/draft_head.py), after `context` tokens, a token each in turn (the order turned each
    time) so a busy host's drift hits all alike: c, the draft's cost in main tokens, is their ratio."""
    spec = own_engine_precision(mode_spec(spec, mode, speculative=True))
    core, rng = ov.Core(), np.random.default_rng(0)
    properties = spec.device_properties(device=spec.device)
    main = measuring_model(core.compile_model(read_paged(core, spec.main_dir), spec.device, properties),
                           main_dir=spec.main_dir, properties=properties)
    sequences: dict[str, PagedSequence] = {"main": main.sequence(exact=True)}
    heads = {"whole head": "", "cut head": spec.draft_head_ids} if spec.draft_head_ids else {"whole head": ""}
    for name, ids in heads.items():
        compiled, head = compile_draft(core, draft_dir=spec.draft_dir, head_ids=ids, device=spec.draft_runs_on,
                                       properties=spec.device_properties(device=spec.draft_runs_on))
        sequences[name] = measuring_model(compiled, head=head).sequence()
    seconds: dict[str, list[float]] = {name: [] for name in sequences}
    prompt = rng.integers(100, 20_000, size=context).tolist()
    for sequence in sequences.values():
        sequence.prefill(prompt)
    names = list(sequences)
    for index in range(tokens):
        token = int(rng.integers(100, 20_000))
        for name in names[index % len(names):] + names[:index % len(names)]:
            began = time.perf_counter()
            sequences[name].feed([token])
            seconds[name].append(time.perf_counter() - began)
    return {name: statistics.median(values) * 1000 for name, values in seconds.items()}


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.2f}" if whole else "-"


def report(lines: list[Line], costs: dict[str, dict[int, float]],
           draft_costs: dict[str, dict[str, float]] | None = None) -> str:
    fastest = max(line.tokens_per_s for line in lines if not line.k)
    rows = [("| line | tok/s | vs its mode's main alone | vs the fastest main alone | acceptance | tokens per step "
             "| steps nothing proposed | n-gram lookup: steps, acceptance | draft model: acceptance "
             "| identical to its mode's main alone | looping |"), "| --- |" + " ---: |" * 10]
    for line in lines:
        alone = next(m for m in lines if m.mode == line.mode and not m.k)
        shown = line.k and not line.speculating
        per_step = ("-" if line.speculating else f"{line.tokens / max(line.steps + len(line.answers), 1):.2f}" if line.k
                    else "1.00")
        ngram = (f"{line.ngram_steps / max(line.steps, 1):.0%}, {_share(line.ngram_accepted, line.ngram_proposed)}"
                 if shown and line.ngram_steps else "-")
        draft = _share(line.accepted - line.ngram_accepted, line.proposed - line.ngram_proposed) if shown else "-"
        undrafted = f"{line.undrafted / max(line.steps, 1):.0%}" if shown else "-"
        rows.append(f"| {line.name} | {line.tokens_per_s:.1f} | {line.tokens_per_s / alone.tokens_per_s:.2f}x | "
                    f"{line.tokens_per_s / fastest:.2f}x | {_share(line.accepted, line.proposed) if shown else '-'} | "
                    f"{per_step} | {undrafted} | {ngram} | {draft} | {line.identical}/{len(line.answers)} | "
                    f"{line.looping}/{len(line.answers)} |")
    rows += ["", "The main's cost of one inference of n new tokens (ms, and x one token):", "",
             "| mode | " + " | ".join(f"n={n}" for n in next(iter(costs.values()))) + " |",
             "| --- |" + " ---: |" * len(next(iter(costs.values())))]
    for mode, cost in costs.items():
        rows.append(f"| {mode} | " + " | ".join(f"{ms:.0f} ({ms / cost[1]:.2f}x)" for ms in cost.values()) + " |")
    if draft_costs:
        rows += ["", "One token of the main and of the draft, in turn (ms; c = the draft's / the main's):", "",
                 "| mode | " + " | ".join(next(iter(draft_costs.values()))) + " |",
                 "| --- |" + " ---: |" * len(next(iter(draft_costs.values())))]
        for mode, per_model in draft_costs.items():
            cells = [f"{ms:.1f}" + (f" (c = {ms / per_model['main']:.3f})" if name != "main" else "")
                     for name, ms in per_model.items()]
            rows.append(f"| {mode} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
