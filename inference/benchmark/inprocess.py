"""Speed measurement of a pair: the main alone vs with its draft, in-process and through any other path.

Variants run interleaved (repeat -> prompt -> variant -> path) so that drift of a shared machine
hits all alike; results are compared as ratios within one run. A path is anything with a `name`
and `run(prompt=, variant=, max_new_tokens=) -> Sample`: `InProcessPath` drives openvino-genai
here, the stack clients (inference.benchmark.stack) go through daphne, Redis and a Celery worker.

The theoretical speedup follows Leviathan et al.: with acceptance a, K draft tokens and a
draft/main step cost ratio c, a step yields (1 - a^(K+1)) / (1 - a) tokens and costs 1 + K*c main
steps. Each row also says what the step really cost next to a plain step, so a gap between the
measured and the theoretical speedup can be traced to acceptance or to step cost.
"""

from __future__ import annotations

import queue
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from inference.benchmark.prompts import Prompt
from inference.engines.decoding import DecodingParams, Speculation
from inference.engines.interface import Engine, Finished
from inference.engines.spec import PairSpec, library_route
from inference.engines.speculation_stats import SpeculationStats
from inference.engines.text_assembler import TextAssembler
from inference.limits import FinishReason, Route

INPROCESS = "inprocess"


@dataclass(frozen=True)
class Variant:
    """One way to serve the benchmark's requests. Through the stack, a speculative variant with
    neither K nor threshold lets the worker plan K from the pair's profile and its load (adaptive)."""

    name: str
    speculative: bool
    num_assistant_tokens: int | None = None
    assistant_confidence_threshold: float | None = None
    temperature: float = 0.0
    seed: int | None = None
    own_engine: bool = False  # the main alone on the own engine (where the pair serves lone answers there)

    @property
    def speculation(self) -> Speculation | None:
        """How its answers speculate in-process (none: the main alone)."""
        if not self.speculative or not (self.num_assistant_tokens or self.assistant_confidence_threshold):
            return None
        return Speculation(k=self.num_assistant_tokens, threshold=self.assistant_confidence_threshold)

    def params(self, max_new_tokens: int) -> DecodingParams:
        """A fixed number of tokens (EOS ignored) so every variant does the same work."""
        return DecodingParams(max_new_tokens=max_new_tokens, ignore_eos=True, temperature=self.temperature,
                              seed=self.seed, speculation=self.speculation)

    def request_settings(self, max_new_tokens: int) -> dict:
        """The same request as chat settings / API body fields."""
        data = {"max_tokens": max_new_tokens, "temperature": self.temperature, "ignore_eos": True,
                "speculative": self.speculative}
        if self.seed is not None:
            data["seed"] = self.seed
        if self.num_assistant_tokens is not None:
            data["num_assistant_tokens"] = self.num_assistant_tokens
        if self.assistant_confidence_threshold is not None:
            data["assistant_confidence_threshold"] = self.assistant_confidence_threshold
        return data


PLAIN = Variant("plain", False)
# The own engine's main alone, where the pair serves lone answers on the own engine: the text its lines
# are compared with (the library's main alone computes the same model in other kernels: near-ties can part them).
OWN_PLAIN = Variant("own main alone", False, own_engine=True)
ADAPTIVE = "adaptive"  # through the stack: a request that names no K, planned by the worker for its load
PEER = Variant("peer", False)  # another server's answers, asked beside SpecChat's (benchmark --compare-url)


def k_variant(k: int) -> Variant:
    return Variant(f"K={k}", True, num_assistant_tokens=k)


def threshold_variant(threshold: float) -> Variant:
    return Variant(f"threshold={threshold:g}", True, assistant_confidence_threshold=threshold)


def default_variants(*, ks=range(1, 9), thresholds=(0.3, 0.5)) -> list[Variant]:
    return [PLAIN] + [k_variant(k) for k in ks] + [threshold_variant(t) for t in thresholds]


def sampled_variants(*, ks, temperature: float) -> list[Variant]:
    """The main alone and the own engine for each K, at one temperature, seeded so reruns repeat."""
    return [Variant(f"T={temperature:g} plain", False, temperature=temperature, seed=7)] + [
        Variant(f"T={temperature:g} K={k}", True, num_assistant_tokens=k, temperature=temperature, seed=7) for k in ks]


@dataclass
class Sample:
    """One generation as a client saw it: times from submission, counts from the serving side."""

    prompt: Prompt
    text: str
    tokens: int
    started_at: float  # perf_counter seconds at submission
    duration_s: float  # submission -> last token
    ttft_ms: float | None
    token_latency_ms: float | None  # mean time between tokens after the first
    main_steps: int
    accepted: int | None = None
    proposed: int | None = None
    repeat: int = 0
    generation_id: str = ""  # through the stack: the Generation it made, for the TTFT profile
    sent_wall: float | None = None  # through the stack: time.time() when the request was sent
    path: str = ""  # through the stack: the path the worker served it on (stack.served_path)
    route: str = ""  # the engine that served it (limits.Route): whose main alone its text is compared with

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def step_ms(self) -> float | None:
        """Mean time of a decoding step (the prefill step excluded)."""
        if self.main_steps < 2 or self.ttft_ms is None:
            return None
        return (self.duration_s * 1000 - self.ttft_ms) / (self.main_steps - 1)

    def as_dict(self) -> dict:
        return {"prompt": self.prompt.shown, "set": self.prompt.set, "repeat": self.repeat, "tokens": self.tokens,
                "duration_s": self.duration_s, "tokens_per_s": self.tokens_per_s, "ttft_ms": self.ttft_ms,
                "token_latency_ms": self.token_latency_ms, "main_steps": self.main_steps,
                "accepted": self.accepted, "proposed": self.proposed, "generation_id": self.generation_id,
                "sent_wall": self.sent_wall, "path": self.path, "route": self.route}


@dataclass
class VariantResult:
    variant: Variant
    samples: list[Sample] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> list[float]:
        return [s.tokens_per_s for s in self.samples]

    @property
    def tokens_per_s_by_repeat(self) -> list[float]:
        """The median over prompts of each repeat: the spread of these is the run-to-run spread."""
        repeats = sorted({s.repeat for s in self.samples})
        return [statistics.median(s.tokens_per_s for s in self.samples if s.repeat == r) for r in repeats]

    @property
    def ttft_ms(self) -> list[float]:
        return [s.ttft_ms for s in self.samples if s.ttft_ms is not None]

    @property
    def token_latency_ms(self) -> list[float]:
        return [s.token_latency_ms for s in self.samples if s.token_latency_ms is not None]

    @property
    def step_ms(self) -> list[float]:
        return [s.step_ms for s in self.samples if s.step_ms is not None]

    @property
    def acceptance_rate(self) -> float | None:
        proposed = sum(s.proposed or 0 for s in self.samples)
        return sum(s.accepted or 0 for s in self.samples) / proposed if proposed else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per verifying step, the main's own token included (vLLM's "mean acceptance length")."""
        steps = sum(max(s.main_steps - 1, 0) for s in self.samples)
        if not self.variant.speculative or not steps:
            return None
        return sum(max(s.tokens - 1, 0) for s in self.samples) / steps

    @property
    def expected_tokens_per_step(self) -> float | None:
        """Leviathan et al.'s tokens per step for fixed K, from each generation's own acceptance and
        combined as the measured length is (all generations have the same token count, so the
        harmonic mean): acceptance differs a lot between prompts and the formula is convex in it."""
        k = self.variant.num_assistant_tokens
        per_sample = [expected_tokens_per_step(s.accepted / s.proposed, k) for s in self.samples
                      if k and s.proposed and s.accepted is not None]
        return len(per_sample) / sum(1 / e for e in per_sample) if per_sample else None

    @property
    def texts(self) -> dict[str, str]:
        return {s.prompt.text: s.text for s in self.samples}

    def of_set(self, name: str) -> VariantResult:
        return VariantResult(self.variant, [s for s in self.samples if s.prompt.set == name])


# ------------------------------------------------------------------ in-process
class Engines:
    """The pipelines an in-process benchmark drives: the pair with and without its draft (same
    backend and scheduler settings), the main alone and the own engine as the host serves them (`alone`,
    `own`), and the draft alone for the cost ratio. `get` gives the
    engine for a spec (a worker passes its registry's); without it each is built once here and
    freed by `close`."""

    def __init__(self, spec: PairSpec, get: Callable[[PairSpec], Engine] | None = None, alone: PairSpec | None = None,
                 own: PairSpec | None = None, lone_on_own: bool = False):
        self.spec = spec
        self.alone = alone  # the main alone as the host serves it (the fastest configuration measured there)
        self.own = own  # the own engine as the host serves it (its calibrated configuration, int8 activations)
        self.lone_on_own = lone_on_own  # the pair's lone answers with a K run on the own engine, greedy ones too
        self._get = get
        self._built: dict[PairSpec, Engine] = {}

    def _engine(self, spec: PairSpec) -> Engine:
        if self._get:
            return self._get(spec)
        if spec not in self._built:
            from inference.serving.registry import build_engine  # the engines load here, not with the admin's modules

            self._built[spec] = build_engine(spec)
        return self._built[spec]

    def pair(self, route: Route, *, as_served: bool = True) -> Engine:
        """The engine that serves `route` (the own engine's where the pair has one, else the library's route over
        the pair's models). `as_served`: the main alone in the configuration the host serves it in, else in the
        pair's own."""
        if route == Route.LIBRARY_MAIN_ALONE and self.alone and as_served:
            return self._engine(self.alone)
        if route.is_own_engine() and self.own:
            return self._engine(self.own)
        return self._engine(replace(self.spec, route=library_route(self.spec, speculative=route.speculates())))

    def for_variant(self, variant: Variant) -> Engine:
        """Where the product runs a lone answer like `variant`: a sampled one with a draft on the own engine, a greedy
        one too where the pair serves lone answers there; a confidence threshold only the library applies."""
        if variant.own_engine:
            return self.pair(Route.OWN_MAIN_ALONE)
        on_own = variant.speculative and (variant.temperature > 0 or (
            self.lone_on_own and variant.assistant_confidence_threshold is None))
        if on_own:
            return self.pair(Route.OWN_SPECULATIVE)
        return self.pair(Route.LIBRARY_SPECULATIVE if variant.speculative else Route.LIBRARY_MAIN_ALONE)

    def draft_alone(self) -> Engine:
        return self._engine(replace(self.spec, slug=f"{self.spec.slug}-draft-alone", main_dir=self.spec.draft_dir,
                                    draft_dir="", route=Route.LIBRARY_MAIN_ALONE))

    def close(self) -> None:
        for engine in self._built.values():
            engine.close()
        self._built.clear()


TOKEN_TIMEOUT_S = 300  # a generation silent this long is not coming back


def run_once(engine: Engine, *, prompt: str, params: DecodingParams) -> tuple[str, SpeculationStats, float]:
    """One generation on an engine: its text, step stats, and when it was submitted."""
    speculative = engine.spec.uses_draft or engine.spec.uses_prompt_lookup
    fixed_k = params.speculation.k if params.speculation else None
    stats = SpeculationStats(num_assistant_tokens=fixed_k if speculative else None, speculative=speculative,
                             max_new_tokens=params.max_new_tokens, drafter=engine.spec.drafter)
    text = TextAssembler(engine.tokenizer)
    request = engine.submit(prompt=prompt, params=params)
    try:
        while not isinstance(item := request.next_step(timeout=TOKEN_TIMEOUT_S), Finished):
            stats.add_step(len(item.token_ids), item.at, drafter=item.drafter, proposed=item.proposed)
            text.add(item.token_ids)
    except queue.Empty:
        raise TimeoutError(f"The benchmark stopped: the engine wrote no token for {TOKEN_TIMEOUT_S} s (an "
                           "overloaded worker, or an engine that hangs).") from None
    if item.finish_reason == FinishReason.ERROR:
        raise RuntimeError(item.error)
    text.finish()
    return text.text, stats, request.added_at


class InProcessPath:
    name = INPROCESS

    def __init__(self, engines: Engines):
        self.engines = engines

    def run(self, *, prompt: Prompt, variant: Variant, max_new_tokens: int) -> Sample:
        engine = self.engines.for_variant(variant)
        text, stats, started = run_once(engine, prompt=prompt.text, params=variant.params(max_new_tokens))
        decode_s = (stats.last_token_at or started) - (stats.first_token_at or started)
        speculative = engine.spec.uses_draft or engine.spec.uses_prompt_lookup
        route = engine.spec.route
        if route == Route.OWN_SPECULATIVE and variant.speculation is None:
            route = Route.OWN_MAIN_ALONE
        return Sample(
            prompt=prompt, text=text, tokens=stats.tokens, started_at=started,
            duration_s=(stats.last_token_at or started) - started,
            ttft_ms=(stats.first_token_at - started) * 1000 if stats.first_token_at else None,
            token_latency_ms=decode_s * 1000 / (stats.tokens - 1) if stats.tokens > 1 else None,
            main_steps=stats.main_steps,
            accepted=stats.accepted if speculative else None,
            proposed=stats.proposed if speculative and stats.num_assistant_tokens else None, route=route,
        )


class BenchmarkPath(Protocol):
    name: str

    def run(self, *, prompt: Prompt, variant: Variant, max_new_tokens: int) -> Sample: ...


Progress = Callable[[int, int, str], None]  # (done, total, what runs now)


def measure(
    *, plan: list[tuple[BenchmarkPath, list[Variant]]], prompts: list[Prompt], max_new_tokens: int = 128,
    repeats: int = 3, progress: Progress | None = None,
) -> dict[str, dict[str, VariantResult]]:
    """Results per path and variant. Each (path, variant) first runs once unrecorded, which loads
    its pipeline; then repeat -> prompt -> variant -> path, so drift hits all alike."""
    results = {path.name: {v.name: VariantResult(v) for v in variants} for path, variants in plan}
    variants = list(dict.fromkeys(v for _, vs in plan for v in vs))
    order = [(path, v) for v in variants for path, vs in plan if v in vs]
    total, done = len(order) * (1 + repeats * len(prompts)), 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total, label)

    for path, variant in order:
        path.run(prompt=prompts[0], variant=variant, max_new_tokens=min(16, max_new_tokens))
        tick(f"warm-up {path.name} {variant.name}")
    for repeat in range(repeats):
        for index, prompt in enumerate(prompts):
            for path, variant in order:
                sample = path.run(prompt=prompt, variant=variant, max_new_tokens=max_new_tokens)
                sample.repeat = repeat
                results[path.name][variant.name].samples.append(sample)
                tick(f"{path.name} {variant.name} prompt {index + 1}/{len(prompts)} repeat {repeat + 1}/{repeats}")
    return results


def measure_inprocess(
    *, spec: PairSpec | None = None, engines: Engines | None = None, prompts: Sequence[str | Prompt],
    variants: list[Variant], max_new_tokens: int = 128, repeats: int = 3, progress: Progress | None = None,
) -> dict[str, VariantResult]:
    """The in-process part alone (the demo-pair builder uses it to choose K). Engines built here
    from `spec` are freed at the end; pass `engines` to share them with draft_cost_ratio."""
    engines, own = _engines_for(spec, engines)
    try:
        return measure(plan=[(InProcessPath(engines), variants)], max_new_tokens=max_new_tokens, repeats=repeats,
                       prompts=[p if isinstance(p, Prompt) else Prompt(p) for p in prompts],
                       progress=progress)[INPROCESS]
    finally:
        if own:
            engines.close()


def _engines_for(spec: PairSpec | None, engines: Engines | None) -> tuple[Engines, bool]:
    """The engines to measure with, and whether they are the caller's own to close."""
    if engines is not None:
        return engines, False
    if spec is None:
        raise TypeError("a spec or engines is needed")
    return Engines(spec), True


def draft_cost_ratio(*, spec: PairSpec | None = None, engines: Engines | None = None, prompt: str,
                     max_new_tokens: int = 64, repeats: int = 3) -> float:
    """Time per token of the draft alone over the main alone (plain pipelines, same settings), interleaved."""
    engines, own = _engines_for(spec, engines)
    try:
        alone = {"main": engines.pair(Route.LIBRARY_MAIN_ALONE, as_served=False), "draft": engines.draft_alone()}
        times: dict[str, list[float]] = {"main": [], "draft": []}
        params = DecodingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
        for engine in alone.values():  # warm-up
            run_once(engine, prompt=prompt, params=replace(params, max_new_tokens=4))
        for _ in range(repeats):
            for name, engine in alone.items():
                _, stats, _ = run_once(engine, prompt=prompt, params=params)
                if stats.first_token_at is None or stats.last_token_at is None:
                    raise RuntimeError(f"the {name} alone answered no tokens")
                times[name].append((stats.last_token_at - stats.first_token_at) / max(stats.tokens - 1, 1))
        return statistics.median(times["draft"]) / statistics.median(times["main"])
    finally:
        if own:
            engines.close()


def expected_tokens_per_step(acceptance: float, k: int) -> float:
    if acceptance >= 1:
        return k + 1.0
    return (1 - acceptance ** (k + 1)) / (1 - acceptance)


def timestamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")
