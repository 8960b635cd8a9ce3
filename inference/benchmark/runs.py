"""A whole benchmark of a pair, as `manage.py benchmark` and the admin's worker task run it.

`run_benchmark` plans the variants from the pair and the options, runs the in-process part and,
given a stack, the same variants through the websocket and SSE clients (all interleaved) and
then the concurrency sweep, and returns one results dict (what results.json holds). The runs
kept in the database, and the admin's run on a worker, are in records.py.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from inference import pair_checks
from inference.benchmark import report
from inference.benchmark.inprocess import (
    ADAPTIVE,
    INPROCESS,
    OWN_PLAIN,
    PEER,
    PLAIN,
    Engines,
    InProcessPath,
    Progress,
    Variant,
    default_variants,
    draft_cost_ratio,
    k_variant,
    measure,
    sampled_variants,
    threshold_variant,
    timestamp,
)
from inference.benchmark.prompts import Prompt, heldout_prompts
from inference.benchmark.summary import compare_to_inprocess, first_texts, loop_warning, summarize
from inference.limits import Route
from inference.models import ModelPair
from inference.serving import planning
from inference.serving.precision import CONFIGS

if TYPE_CHECKING:
    from inference.benchmark.peer import PeerServer
    from inference.benchmark.stack import StackTarget

CLIENTS = ("websocket", "sse")  # inference.benchmark.stack's, imported only with a stack (it needs aiohttp)


def int_list(text: str) -> tuple[int, ...]:
    """`1-8`, `2,4,8` or a mix; ValueError otherwise."""
    values: list[int] = []
    for part in filter(None, text.replace(" ", "").split(",")):
        low, _, high = part.partition("-")
        values += range(int(low), int(high or low) + 1)
    return tuple(values)


def float_list(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in filter(None, text.replace(" ", "").split(",")))


@dataclass(frozen=True)
class BenchmarkOptions:
    max_new_tokens: int = 128
    repeats: int = 3
    ks: tuple[int, ...] = tuple(range(1, 9))
    thresholds: tuple[float, ...] = (0.3, 0.5)
    prompt_sets: tuple[str, ...] = ("code", "prose")
    prompts_per_set: int | None = 4
    clients: tuple[str, ...] = ("websocket", "sse")  # stack clients; () measures in-process only
    stack_ks: tuple[int, ...] = ()  # K values through the stack; () means the pair's default
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)
    concurrency_client: str = "sse"
    steady_rounds: int = 3  # answers each client asks in turn at steady load (0: bursts only)
    sampled_ks: tuple[int, ...] = (2, 3, 4)  # the own engine at T = sampled_temperature; () skips sampled rows
    sampled_temperature: float = 0.8

    def __post_init__(self):
        unknown = [c for c in (*self.clients, self.concurrency_client) if c not in CLIENTS]
        if unknown:
            raise ValueError(f"unknown client(s) {', '.join(unknown)}; choose from {', '.join(CLIENTS)}")
        if self.max_new_tokens < 2 or self.repeats < 1 or any(k < 1 for k in (*self.ks, *self.stack_ks)):
            raise ValueError("max_new_tokens must be at least 2, repeats and every K at least 1")
        if any(not 0 < t < 1 for t in self.thresholds) or any(n < 1 for n in self.concurrency):
            raise ValueError("thresholds must be in (0, 1) and concurrency levels at least 1")
        if self.steady_rounds < 0:
            raise ValueError("steady rounds must be 0 (none) or more")

    def as_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> BenchmarkOptions:
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**fields)


def inprocess_variants(*, pair: ModelPair, options: BenchmarkOptions) -> list[Variant]:
    """Plain, the K sweep and, with a draft model, the confidence-threshold mode."""
    if not pair.is_speculative:
        return [PLAIN]
    return default_variants(ks=options.ks, thresholds=options.thresholds if pair.draft_dir else ())


def variant_order(variant: Variant) -> tuple:
    """Plain (the library's main alone, then the own engine's), then K ascending, then the thresholds."""
    threshold = variant.assistant_confidence_threshold
    return (variant.speculative, variant.own_engine, threshold is not None, variant.num_assistant_tokens or 0,
            threshold or 0)


def stack_variants(*, pair: ModelPair, options: BenchmarkOptions) -> list[Variant]:
    """Plain and the pair's default speculation (or the asked K values), through the stack."""
    if not pair.is_speculative:
        return [PLAIN]
    if options.stack_ks:
        return [PLAIN] + [k_variant(k) for k in options.stack_ks]
    if pair.assistant_confidence_threshold is not None and pair.draft_dir:
        return [PLAIN, threshold_variant(pair.assistant_confidence_threshold)]
    return [PLAIN, k_variant(pair.num_assistant_tokens or 5)]  # 5: the engine's fallback K


def same_prompt_through_chat(*, pair: ModelPair, prompts) -> bool:
    """Whether the chat, which applies the chat template (serving.web.chat_prompt) and adds no special tokens,
    gives the model the same tokens as in-process runs of the bare prompt (true for the demo pair)."""
    tokenizer = pair_checks.load_tokenizer(str(pair_checks.resolve_model_dir(pair.main_dir)))
    return all(
        tokenizer.apply_chat_template([{"role": "user", "content": p.text}], add_generation_prompt=True) == p.text
        and tokenizer.encode(p.text, add_special_tokens=True).input_ids.data.tolist()
        == tokenizer.encode(p.text, add_special_tokens=False).input_ids.data.tolist()
        for p in prompts
    )


def concurrency_lines(through_stack: list[Variant]) -> list[Variant]:
    """The sweeps' lines: the main alone, the first speculative variant, and adaptive (requests naming no K)."""
    return through_stack[:2] + ([Variant(ADAPTIVE, True)] if len(through_stack) > 1 else [])


def machine() -> dict:
    """The host a run measured, with the library's version (openvino loads here, not with the admin's modules)."""
    import openvino
    import openvino_genai

    return {"cpus": os.cpu_count(), "cpu": openvino.Core().get_property("CPU", "FULL_DEVICE_NAME"),
            "platform": platform.platform(), "load_average": os.getloadavg(),
            "openvino_genai": openvino_genai.__version__}


def benchmark_engines(*, pair: ModelPair, get=None) -> tuple[Engines, str]:
    """The engines a benchmark measures, its baseline the main alone as this host serves it (the fastest
    configuration its calibration measured), and a note that says which."""
    from inference.serving.calibrated import host_figures
    from inference.serving.host import this_host
    from inference.serving.records import pair_spec

    figures = host_figures(pair=pair, host=this_host(pair.runs_on))
    alone = pair_spec(pair=pair, route=Route.LIBRARY_MAIN_ALONE, calibration=figures)
    if figures.calibrated:
        note = f"The main alone runs in this host's fastest configuration ({CONFIGS[figures.main_alone_config].label})."
    else:
        note = (f"{figures.host} has no calibration of the pair: the main alone runs in the pair's own precision, "
                f"maybe not the fastest here (manage.py calibrate {pair.slug} first).")
    own = pair_spec(pair=pair, route=Route.OWN_SPECULATIVE, calibration=figures) if pair.draft_dir else None
    if get is None:  # in-process no line keeps a prompt cache: every answer reads its prompt, as a new one would
        alone = replace(alone, prefix_caching=False)
        own = replace(own, prefix_caching=False) if own else None
    elif own and own.prefix_caching:  # a worker's: the one it serves with, not a second copy of the weights
        note += " The own engine keeps its prompt cache here: a repeated prompt's first token comes sooner."
    lone_on_own = bool(own and pair.own_engine_streams)
    note += (" In-process, the K lines run on the own engine, as the worker serves a lone answer with a K."
             if lone_on_own else
             " In-process, the K lines run on the library's speculative pipeline, as the library serves a draft.")
    return Engines(pair_spec(pair=pair), get=get, alone=alone, own=own, lone_on_own=lone_on_own), note


def run_benchmark(*, pair: ModelPair, options: BenchmarkOptions, engines: Engines, stack: StackTarget | None = None,
                  progress: Progress | None = None, notes: tuple[str, ...] = (),
                  prompts: list[Prompt] | None = None, peer: PeerServer | None = None) -> dict:
    """`prompts`: a user's own (a file, the pair's history) instead of the repository's held-out sets;
    `peer`: another server asked the same (one stream and the sweep; needs the stack)."""
    started_at = timestamp()
    prompts = prompts or heldout_prompts(sets=options.prompt_sets, per_set=options.prompts_per_set)
    variants = inprocess_variants(pair=pair, options=options)
    through_stack = stack_variants(pair=pair, options=options) if stack and options.clients else []
    variants = sorted(set(variants) | set(through_stack) | ({OWN_PLAIN} if engines.lone_on_own else set()),
                      key=variant_order)  # each stack variant has its twin; own-engine lines, their main alone
    plan: list = [(InProcessPath(engines), variants)]
    sweep_variants = concurrency_lines(through_stack)
    if stack and through_stack:
        from inference.benchmark.stack import StackPath

        plan += [(StackPath(name, stack.client(name)), through_stack) for name in options.clients]
        if peer:
            plan.append((StackPath(PEER.name, peer.client()), [PEER]))
    burst_variants = sweep_variants + ([PEER] if peer and stack and through_stack else [])
    levels = sorted(set(options.concurrency)) if through_stack else []
    measure_total = sum(len(lines) for _, lines in plan) * (1 + options.repeats * len(prompts))
    sweep_offset = measure_total + bool(pair.draft_dir)
    steady_offset = sweep_offset + options.repeats * len(levels) * len(burst_variants)
    total = steady_offset + (len(levels) * len(sweep_variants) if options.steady_rounds else 0)

    def phase(offset: int) -> Progress | None:
        return (lambda done, _, label: progress(offset + done, total, label)) if progress else None

    results = measure(plan=plan, prompts=prompts, max_new_tokens=options.max_new_tokens, repeats=options.repeats,
                      progress=phase(0))
    run_notes = list(notes)
    looping = loop_warning(results[INPROCESS])
    if looping:
        run_notes.append(looping)
    cost_ratio = None
    if pair.draft_dir:
        cost_ratio = draft_cost_ratio(engines=engines, prompt=prompts[0].text,
                                      max_new_tokens=min(64, options.max_new_tokens), repeats=options.repeats)
        if progress:
            progress(sweep_offset, total, "draft/main cost ratio")
    elif pair.prompt_lookup:
        cost_ratio = 0.0
        run_notes.append("Prompt lookup has no draft model: its proposals are taken as free (c = 0).")
    reference = first_texts(results[INPROCESS][PLAIN.name])
    own_reference = first_texts(results[INPROCESS][OWN_PLAIN.name]) if engines.lone_on_own else None
    chat_same = "websocket" not in results or same_prompt_through_chat(pair=pair, prompts=prompts)
    if not chat_same:
        run_notes.append("The chat template changes the prompt: websocket texts are not compared with in-process ones.")
    rows = [row for path, by_variant in results.items()
            for row in summarize(by_variant, cost_ratio=cost_ratio, path=path,
                                 reference=reference if path != "websocket" or chat_same else None,
                                 own_reference=own_reference)]
    measured: dict[str, Any] = {
        "pair": pair.slug,
        "started_at": started_at,
        "machine": machine(),
        "options": options.as_json(),
        "scheduler": {"prefill_first": engines.spec.prefill_first, "budget": engines.spec.step_budget},  # None: 256
        "prompts": len(prompts),
        "prompt_sets": sorted({p.set for p in prompts}),
        "cost_ratio": cost_ratio,
        "stack_url": stack.base_url if stack and through_stack else None,
        "rows": compare_to_inprocess(rows, results),
        "by_set": [row for name in dict.fromkeys(p.set for p in prompts)
                   for row in summarize({v: r.of_set(name) for v, r in results[INPROCESS].items()},
                                        cost_ratio=cost_ratio, reference=reference, own_reference=own_reference,
                                        prompt_set=name)],
        "ttft_profile": [],
        "concurrency": [],
        "concurrency_bursts": [],
        "steady": [],
        "samples": {path: {v: [s.as_dict() for s in r.samples] for v, r in by_variant.items()}
                    for path, by_variant in results.items()},
        "notes": run_notes,
    }
    if stack and through_stack:
        measured.update(_under_load(stack=stack, peer=peer, options=options, prompts=prompts, results=results,
                                    levels=levels, lines=(sweep_variants, burst_variants),
                                    progress=(phase(sweep_offset), phase(steady_offset))))
    measured["sampled"] = measure_sampled(pair=pair, options=options, engines=engines, prompts=prompts)
    measured["finished_at"] = timestamp()
    measured["bars"] = report.evaluate_bars(measured)
    return measured


def _under_load(*, stack: StackTarget, peer: PeerServer | None, options: BenchmarkOptions, prompts: list[Prompt],
                results: dict, levels: list[int], lines: tuple[list[Variant], list[Variant]],
                progress: tuple[Progress | None, Progress | None]) -> dict:
    """The stack's TTFT split, the bursts (the peer's line among them) and the steady load; `lines`: the
    steady load's and the bursts' variants; `progress`: the bursts' and the steady load's."""
    from inference.benchmark.peer import beside_peer
    from inference.benchmark.stack import ttft_profile
    from inference.benchmark.sweeps import burst_ttft_profile, concurrency_sweep, steady_sweep, summarize_concurrency

    steady_lines, burst_lines = lines
    measured: dict[str, Any] = {"ttft_profile": ttft_profile({name: [s.as_dict() for r in results[name].values()
                                                                     for s in r.samples] for name in options.clients})}
    stream = stack.client(options.concurrency_client)
    if levels:
        measured["concurrency_bursts"] = concurrency_sweep(
            stream=beside_peer(stream, peer) if peer else stream, prompts=prompts, levels=levels,
            variants=burst_lines, max_new_tokens=options.max_new_tokens, repeats=options.repeats,
            progress=progress[0])
        measured["concurrency"] = summarize_concurrency(measured["concurrency_bursts"])
        measured["ttft_profile"] += burst_ttft_profile(measured["concurrency_bursts"],
                                                       client=options.concurrency_client)
    if levels and options.steady_rounds:
        measured["steady"] = steady_sweep(
            stream=stream, prompts=prompts, levels=levels, variants=steady_lines,
            max_new_tokens=options.max_new_tokens, rounds=options.steady_rounds, progress=progress[1])
    if peer:
        measured["peer"] = {"url": peer.base_url, "model": peer.model,
                            "side_by_side": report.side_by_side(measured.get("concurrency") or [])}
    return measured


def measure_sampled(*, pair: ModelPair, options: BenchmarkOptions, engines: Engines, prompts) -> list[dict]:
    """Sampled rows in-process: the main alone and the own engine per K at one temperature, and
    which of them the product chooses for a lone request (its plan at load 1)."""
    if not pair.draft_dir or not options.sampled_ks:
        return []
    chosen = planning.plan(pair=pair, asked=planning.Asked(sampled=True), load=planning.Load(streams=1))
    ks = sorted({*options.sampled_ks, *([chosen.k] if chosen.route.speculates() and chosen.k else [])})
    variants = sampled_variants(ks=ks, temperature=options.sampled_temperature)
    results = measure(plan=[(InProcessPath(engines), variants)], prompts=prompts,
                      max_new_tokens=options.max_new_tokens, repeats=options.repeats)[INPROCESS]
    rows = summarize(results, plain_name=variants[0].name, greedy=False)
    chosen_name = (variants[0].name if chosen.route.is_main_alone()
                   else f"T={options.sampled_temperature:g} K={chosen.k}")
    for row in rows:
        row["chosen"] = row["variant"] == chosen_name
    return rows


def history_prompts(*, pair: ModelPair, count: int) -> list[Prompt]:
    """The last `count` distinct prompts the pair was sent (chat and API), as its worker got them (chat
    template applied): the workload its users really send. Private: the results keep digests of them."""
    texts: list[str] = []
    for text in pair.generations.order_by("-created_at").values_list("prompt", flat=True).iterator():
        if text not in texts:
            texts.append(text)
        if len(texts) == count:
            break
    if not texts:
        raise ValueError(f"'{pair.slug}' has no recorded prompts yet")
    return [Prompt(text, "history", private=True) for text in texts]
