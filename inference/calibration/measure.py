"""What a calibration measures, in-process on the worker's host, within a budget of seconds:

1. the main alone (the library's pipeline) in each precision configuration the device offers, at one stream
   and at several at once: the fastest is the host's baseline, and every route of the main alone serves in it;
2. the own engine (engines/own/engine.py) in the faster configuration of those its greedy answers with the draft are
   exact in (f32 with or without dynamic quantization), at K=0 and each K, beside the fastest main alone again:
   tokens/s, acceptance and identity; where the pair keeps its draft in two weight formats, first a draft token of
   each in that configuration, and the Ks with the cheaper (int4 kernels are the cheaper with AVX-512, int8 ones
   with AVX2), which the own engine then loads on this host; and at several at once, the answers speculating in its
   batch at each of a few Ks (Speculation.batch_k) beside its batched main alone;
3. the main's cost of one inference of n = 1..8 tokens in that configuration (what K can pay);
4. a lone answer at the K chosen, the draft chained after the conversation's lookup, against the lookup alone and
   the main alone (the own engine's and the fastest) after a long prompt (LONG_CONTEXT tokens, a pasted file, read
   once and kept in the prefix caches, as in a conversation's follow-ups; a question about it and an edit that
   copies part of it): the K long answers get with the draft, or 0 where the lookup alone or the main alone was
   faster there (the plan then proposes from the conversation alone: a lookup that misses costs a main alone's step),
   and which main alone runs them faster; where the draft stopped paying, from how many prompt tokens: where the gain
   measured after the short prompts and the long one falls to nothing between the two (verdicts.py,
   long_context_from).

Each phase runs its lines in rounds, the order turned each round, so that a shared host's drift
(docs/calibration.md#what-a-calibration-measures) falls on every line alike; the figures are the rounds' sums. From
them: the K a lone answer gets (0: speculation does not pay on this host, the main alone serves), and the K answers
beyond the pair's speculating streams get in the batch (0: the main alone's batch, where no K beat it and the
library's main alone), as verdicts.py reads them. Prompts are the pair's own where it keeps them
(CALIBRATION_PROMPTS), else the repository's held-out ones, through the pair's chat template."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import median

import openvino as ov

from inference.benchmark.modes import Tally, answer, infer_cost, measuring_model
from inference.benchmark.prompts import heldout_prompts, prompts_from_file
from inference.calibration.verdicts import LIBRARY_MARGIN, best_batch_k, best_k, library_alone, long_context_from
from inference.engines.decoding import Speculation
from inference.engines.interface import Engine
from inference.engines.own.draft_head import compile_draft
from inference.engines.own.engine import OwnEngine, own_engine_precision
from inference.engines.spec import PairSpec, context_length
from inference.engines.tokenizer import load_tokenizer
from inference.limits import Route
from inference.serving.precision import CONFIGS, EXACT_ON_OWN_ENGINE, offered
from inference.serving.registry import build_engine

Progress = Callable[[int, int, str], None]
# A configuration this far behind the fastest after a round, at one stream and at several, is not measured again: its
# rounds go to the own engine's lines (measuring the slow configurations twice left the Ks too little of the budget:
# docs/calibration.md#what-a-calibration-measures).
FAR_BEHIND = 0.8
# The larger Ks run with the draft holding back a token it gives a probability below this
# (engines/own/proposers/draft_model.py): where verifying many tokens costs little more than one, a long step pays when
# the draft is sure and stops where it is not.
# 0.5 was the best stop on chat-a by draft_stop.py's replay (git 43561ef) and held on chat-b.
DRAFT_STOP_BELOW = 0.5
# A pair's own calibration prompts, beside its main and draft folders (a prompts file as `benchmark --prompts-file`
# takes): requests like its traffic. `make real-pair` places the real pair's.
CALIBRATION_PROMPTS = "calibration-prompts.json"
LONG_CONTEXT = 2000  # prompt tokens of phase 4: a pasted file and a question, as a long chat's follow-ups send
LONG_QUESTION_ROOM = 64  # the chat template and the question around the pasted file
# A question about the pasted file, and an edit that copies part of it, as a chat with a paste asks both
LONG_QUESTIONS = ("Explain what the first class in this file is for.",
                  "Add type hints to the first class's __init__ and show the whole method.")


@dataclass(frozen=True)
class Budget:
    prompts: int = 2  # held-out prompts a line answers one at a time, one a round (code, prose, ...)
    max_new_tokens: int = 48
    streams: int = 4  # answered at once, for the main alone under load
    ks: tuple[int, ...] = (1, 2, 3, 4)
    stopped_ks: tuple[int, ...] = (6, 8)  # measured with the draft stopping where unsure (DRAFT_STOP_BELOW)
    batch_ks: tuple[int, ...] = ()  # `streams` answers speculating in the own engine's batch (none: not measured)
    rounds: int = 2
    cost_sizes: tuple[int, ...] = tuple(range(1, 9))
    seconds: float = 240  # no round starts that would end past this (its length guessed from the last)


@dataclass
class Line(Tally):
    """One measured line: an engine, a K (0: the main alone) and how many answers at once."""

    engine: Engine
    k: int = 0
    streams: int = 1
    draft_stop_below: float | None = None
    batch_k: int = 0
    lookup_only: bool = False  # the conversation's lookup alone proposes, up to K (no draft inference)
    rounds: int = 0

    @property
    def speculation(self) -> Speculation | None:
        if not self.k:
            return None
        return Speculation(k=self.k, draft_stop_below=self.draft_stop_below, batch_k=self.batch_k or None,
                           lookup_only=self.lookup_only)

    def run(self, prompts: list[str], *, max_new_tokens: int) -> None:
        self.run_round(self.engine, prompts, lambda _: {"speculation": self.speculation,
                                                         "max_new_tokens": max_new_tokens})
        self.rounds += 1

    def figures(self, *, alone: Line | None = None) -> dict:
        shown: dict[str, float | int | None] = {"tokens_per_s": round(self.tokens_per_s, 2),
                                                "answers": len(self.answers), "looping": self.looping,
                                                "first_token_ms": self.first_token_ms}
        if self.draft_stop_below is not None:
            shown["draft_stop_below"] = self.draft_stop_below
        if self.k:
            shown |= {"acceptance": round(self.accepted / self.proposed, 3) if self.proposed else None,
                      "lookup_share": round(self.ngram_proposed / self.proposed, 3) if self.proposed else None}
        if alone is not None:
            shown["identical"] = sum(mine == theirs for mine, theirs in zip(self.answers, alone.answers, strict=True))
        return shown


def uncached(spec: PairSpec) -> PairSpec:
    """The engine as phases 1 and 2 time it: every prompt read whole, as a new prompt is. Their rounds answer the same
    prompts again, so an engine keeping them cached would be timed on reads the other makes
    (docs/calibration.md#what-a-calibration-measures)."""
    return replace(spec, prefix_caching=False)


def chat_prompts(main_dir: str, count: int) -> list[str]:
    """`count` prompts as the chat and the API give them to the model: the pair's own (CALIBRATION_PROMPTS beside
    its models) where it has them, else the repository's held-out ones, code and prose alternating."""
    tokenizer = load_tokenizer(main_dir)

    def rendered(messages: list[dict]) -> str:
        return str(tokenizer.apply_chat_template(messages, add_generation_prompt=True))

    own = Path(main_dir).parent / CALIBRATION_PROMPTS
    if own.is_file():
        return [prompt.text for prompt in prompts_from_file(own, render_chat=rendered)][:count]
    code, prose = heldout_prompts(sets=("code",)), heldout_prompts(sets=("prose",))
    mixed = [prompt.text for pair in zip(code, prose, strict=False) for prompt in pair][:count]
    return [rendered([{"role": "user", "content": text}]) for text in mixed]


def calibrate(*, spec: PairSpec, capabilities: list[str], budget: Budget, progress: Progress) -> dict:
    """The figures a HostCalibration keeps (see the module's docstring)."""
    started = time.monotonic()
    prompts = chat_prompts(spec.main_dir, max(budget.prompts, budget.streams))
    alone = {config.name: uncached(replace(spec, route=Route.LIBRARY_MAIN_ALONE, **config.fields))
             for config in offered(capabilities)}
    steps = Steps(total=budget.rounds + (budget.rounds + 2 if spec.draft_dir else 0), report=progress)
    results: dict = {"budget": {**vars(budget), "ks": list(budget.ks), "stopped_ks": list(budget.stopped_ks),
                                "batch_ks": list(budget.batch_ks), "cost_sizes": list(budget.cost_sizes)},
                     "prompts": prompts[:budget.prompts], "prompt_tokens": prompt_tokens(spec.main_dir, prompts),
                     "rounds": {}}
    engines = {name: build_engine(each) for name, each in alone.items()}
    try:
        for engine in engines.values():  # untimed, as the own engine warms itself: first inferences repack weights
            answer(engine, prompts[0], speculation=None, max_new_tokens=4)
        lines = {name: (Line(engine), Line(engine, streams=budget.streams)) for name, engine in engines.items()}
        steps.next("the main alone in each configuration")
        results["rounds"]["configs"] = _rounds([line for pair in lines.values() for line in pair], prompts=prompts,
                                               budget=budget, started=started, steps=steps, narrow=_contenders)
        results["configs"] = {name: {"label": CONFIGS[name].label, "tokens_per_s": one.tokens_per_s,
                                     "streams": budget.streams, "tokens_per_s_streams": many.tokens_per_s,
                                     "rounds": one.rounds}
                              for name, (one, many) in lines.items()}
        ranked = sorted(results["configs"], key=lambda name: results["configs"][name]["tokens_per_s"], reverse=True)
        results["fastest"], results["own_config"] = ranked[0], ""
        for name in ranked[1:]:
            engines.pop(name).close()
        if spec.draft_dir:  # in the faster of the configurations it is exact in
            own = next(name for name in ranked if name in EXACT_ON_OWN_ENGINE)
            # A draft token's cost: which weight format the own engine loads, and what a K per answer weighs
            results["draft_ms"] = draft_token_ms(replace(spec, **CONFIGS[own].fields))
            if results["draft_ms"].get("alternative", float("inf")) < results["draft_ms"]["draft"]:
                spec = replace(spec, draft_dir=spec.draft_alternative_dir)
                results["draft"] = "alternative"
            results |= _own_engine(spec, own, fastest=engines[ranked[0]], prompts=prompts, budget=budget,
                                   started=started, steps=steps)
    finally:
        for engine in engines.values():
            engine.close()
    results["best_k"] = {"1": best_k(results)} if results.get("ks") else {}  # none: out of time before any K
    if results["best_k"].get("1"):  # a phase of its own: not cut by the budget the Ks' rounds shared
        steps.next(f"a lone answer after a {LONG_CONTEXT}-token prompt")
        results["long_context"] = _long_context(spec, results, budget=budget)
        results["long_context"]["from_tokens"] = long_context_from(results)
    results["batch_k"] = best_batch_k(results)
    results["library_alone"] = library_alone(results)
    results["seconds"] = round(time.monotonic() - started, 1)
    progress(steps.total, steps.total, "done")
    return results


def _own_engine(spec: PairSpec, name: str, *, fastest: Engine, prompts: list[str], budget: Budget, started: float,
                steps: Steps) -> dict:
    """The own engine in configuration `name`: its main alone (K=0, and batched at several streams), each K and
    each K in the batch at several streams, in rounds beside the fastest main alone measured again (so that the Ks
    are judged against it in one run). One answer speculates on its own, as a pair's first stream does."""
    config = CONFIGS[name]
    engine = build_engine(uncached(replace(spec, route=Route.OWN_SPECULATIVE, speculating_streams=1, **config.fields)))
    try:
        reference, alone = Line(fastest), Line(engine)
        reference_batched, batched = Line(fastest, streams=budget.streams), Line(engine, streams=budget.streams)
        ks = {k: Line(engine, k=k) for k in budget.ks} | {
            k: Line(engine, k=k, draft_stop_below=DRAFT_STOP_BELOW) for k in budget.stopped_ks}
        in_batch = {k: Line(engine, k=k, streams=budget.streams, batch_k=k) for k in budget.batch_ks}
        batch = f"; {budget.streams} at once in its batch, K={', '.join(map(str, in_batch))}" if in_batch else ""
        steps.next(f"the own engine in {config.label}, K={', '.join(map(str, ks))}{batch}")
        rounds = _rounds([reference, alone, reference_batched, batched, *ks.values(), *in_batch.values()],
                         prompts=prompts, budget=budget, started=started, steps=steps)
    finally:
        engine.close()
    steps.next(f"the main's cost of verifying 1-{budget.cost_sizes[-1]} tokens in {config.label}")
    props = own_engine_precision(replace(spec, **config.fields)).device_properties(device=spec.device)
    costs = infer_cost(main_dir=spec.main_dir, props=props, device=spec.device, sizes=budget.cost_sizes, repeats=8,
                       main_rows=spec.main_rows)
    return {"own_config": name,
            "fastest_again": reference.figures() | _at_once(reference_batched),
            "own_main_alone": alone.figures() | _at_once(batched),
            "ks": {str(k): line.figures(alone=alone) for k, line in ks.items()}, "rounds": {"own": rounds},
            "batch_ks": {str(k): line.figures(alone=batched) for k, line in in_batch.items()},
            "verify_cost": {str(n): round(ms / costs[1], 3) for n, ms in costs.items()},
            "verify_ms": round(costs[1], 2)}


def prompt_tokens(main_dir: str, prompts: list[str]) -> int:
    """The median prompt's length in tokens: where the short prompts' figures stand on the context's axis."""
    tokenizer = load_tokenizer(main_dir)
    return int(median(tokenizer.encode(text, add_special_tokens=False).input_ids.data.shape[1] for text in prompts))


def long_prompts(main_dir: str, tokens: int) -> list[str]:
    """A file of the standard library pasted with a question, cut to about `tokens` through the chat template: the
    same file, another question each (the file is kept in the prefix cache after the first)."""
    tokenizer = load_tokenizer(main_dir)
    source = Path(argparse.__file__).read_text()
    ids = tokenizer.encode(source, add_special_tokens=False).input_ids.data[0].tolist()
    pasted = tokenizer.decode(ids[:tokens])
    return [str(tokenizer.apply_chat_template([{"role": "user", "content": f"```python\n{pasted}\n```\n{question}"}],
                                              add_generation_prompt=True)) for question in LONG_QUESTIONS]


def _long_context(spec: PairSpec, results: dict, *, budget: Budget) -> dict:
    """A lone answer at the chosen K after a long prompt, the draft chained after the conversation's lookup and the
    lookup alone, against the own engine's main alone and the fastest main alone, each engine with its prefix cache
    (the prompt read once, untimed); the K a long answer gets with the draft (0: it did not beat the lookup alone or
    the main alone there, and the plan proposes from the conversation alone)."""
    k = results["best_k"]["1"]
    stop = results["ks"][str(k)].get("draft_stop_below")
    own_config, fastest = CONFIGS[results["own_config"]], CONFIGS[results["fastest"]]
    if results.get("draft") == "alternative":
        spec = replace(spec, draft_dir=spec.draft_alternative_dir)
    own = OwnEngine(replace(spec, route=Route.OWN_SPECULATIVE, speculating_streams=1, **own_config.fields))
    library = build_engine(replace(spec, route=Route.LIBRARY_MAIN_ALONE, **fastest.fields))
    tokens = min(LONG_CONTEXT, context_length(Path(spec.main_dir)) - budget.max_new_tokens - LONG_QUESTION_ROOM)
    prompts = long_prompts(spec.main_dir, tokens)
    try:
        # the file read and kept by both models (the draft after the answer: it is left out of an answer whose prompt
        # it lacks), untimed
        answer(own, prompts[0], speculation=Speculation(k=k), max_new_tokens=2)
        own.draft_caught_up()
        answer(library, prompts[0], speculation=None, max_new_tokens=1)
        drafted, alone, library_alone = Line(own, k=k, draft_stop_below=stop), Line(own), Line(library)
        looked_up = Line(own, k=k, lookup_only=True)
        lines = [drafted, looked_up, alone, library_alone]
        for round_ in range(budget.rounds):
            for line in lines[round_ % len(lines):] + lines[:round_ % len(lines)]:
                line.run([prompts[round_ % len(prompts)]], max_new_tokens=budget.max_new_tokens)
    finally:
        own.close()
        library.close()
    # the steps' costs there, which a long answer's K weighs (StepLength): the draft it loads, alone
    props = own_engine_precision(replace(spec, **own_config.fields)).device_properties(device=spec.device)
    costs = infer_cost(main_dir=spec.main_dir, props=props, device=spec.device, sizes=budget.cost_sizes,
                       context=tokens, repeats=8, main_rows=spec.main_rows)
    draft_ms = draft_token_ms(replace(spec, draft_alternative_dir="", **own_config.fields), context=tokens)
    faster = drafted.tokens_per_s > max(looked_up.tokens_per_s, alone.tokens_per_s, library_alone.tokens_per_s)
    library_faster = (library_alone.tokens_per_s > LIBRARY_MARGIN * alone.tokens_per_s
                      and (library_alone.first_token_ms or 0) <= (alone.first_token_ms or 0))
    return {"tokens": tokens, "k": k if faster else 0, "library_alone": library_faster,
            "drafted": drafted.figures(alone=alone), "lookup_only": looked_up.figures(alone=alone),
            "own_main_alone": alone.figures(),
            "fastest": library_alone.figures(),
            "verify_cost": {str(n): round(ms / costs[1], 3) for n, ms in costs.items()},
            "verify_ms": round(costs[1], 2), "draft_ms": draft_ms}


def draft_token_ms(spec: PairSpec, *, context: int = 64, repeats: int = 12) -> dict[str, float]:
    """Milliseconds of one draft token after a short context, as the own engine runs it (its head cut), for the
    pair's draft and its alternative if it has one, interleaved: {"draft": ms(, "alternative": ms)}."""
    core = ov.Core()
    properties = own_engine_precision(spec).device_properties(device=spec.draft_runs_on)
    sequences = {}
    folders = {"draft": spec.draft_dir, "alternative": spec.draft_alternative_dir}
    for name, folder in ((name, folder) for name, folder in folders.items() if folder):
        compiled, head = compile_draft(core, draft_dir=folder, head_ids=spec.draft_head_ids,
                                       device=spec.draft_runs_on, properties=properties)
        sequences[name] = measuring_model(compiled, head=head).sequence()
        sequences[name].prefill(list(range(1000, 1000 + context)))
        sequences[name].feed([7])  # untimed: the first inference of a shape compiles kernels
        sequences[name].drop_last(1)
    seconds: dict[str, list[float]] = {name: [] for name in sequences}
    for _ in range(repeats):
        for name, sequence in sequences.items():
            began = time.perf_counter()
            sequence.feed([7])
            seconds[name].append(time.perf_counter() - began)
            sequence.drop_last(1)
    return {name: round(1000 * median(each), 2) for name, each in seconds.items()}


def _rounds(lines: list[Line], *, prompts: list[str], budget: Budget, started: float, steps: Steps,
            narrow: Callable[[list[Line]], list[Line]] | None = None) -> int:
    """Every line's answers, round after round with the order turned, until the rounds run out or the next round,
    as long as the last one, would end past the budget (the first round always runs). `narrow`: the lines worth
    another round, after each (none: no round would change the outcome). How many rounds ran."""
    ran, last_round = 0, 0.0
    while ran < budget.rounds and (not ran or time.monotonic() - started + last_round < budget.seconds):
        round_started = time.monotonic()
        turned = lines[ran % len(lines):] + lines[:ran % len(lines)]
        for line in turned:  # one stream: one prompt a round, code and prose in turn
            line.run(prompts[:line.streams] if line.streams > 1 else [prompts[ran % budget.prompts]],
                     max_new_tokens=budget.max_new_tokens)
        ran, last_round = ran + 1, time.monotonic() - round_started
        if narrow:
            if not (kept := narrow(lines)):
                break
            last_round *= sum(line.seconds for line in kept) / sum(line.seconds for line in lines)
            lines = kept
        if ran < budget.rounds:
            steps.next(f"round {ran + 1}")
    return ran


def _contenders(lines: list[Line]) -> list[Line]:
    """Of the main alone's lines (one stream and several, a configuration's two in a row), those of the
    configurations not FAR_BEHIND the fastest at one stream or at several; none once one is left, as there is
    nothing left to rank (the own engine's phase measures the fastest again beside its Ks)."""
    pairs = list(zip(lines[::2], lines[1::2], strict=True))
    best_one = max(one.tokens_per_s for one, _ in pairs)
    best_many = max(many.tokens_per_s for _, many in pairs)
    kept = [line for one, many in pairs if one.tokens_per_s >= FAR_BEHIND * best_one
            or many.tokens_per_s >= FAR_BEHIND * best_many for line in (one, many)]
    return kept if len(kept) > 2 else []


def _at_once(line: Line) -> dict:
    return {"tokens_per_s_streams": line.tokens_per_s, "first_token_ms_streams": line.first_token_ms}


@dataclass
class Steps:
    """The calibration's progress: each phase or round started counts one step of `total`."""

    total: int
    report: Progress
    done: int = 0

    def next(self, label: str) -> None:
        self.report(min(self.done, self.total - 1), self.total, label)
        self.done += 1
