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

import json
import queue
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from inference.engines.base import DecodingParams, Engine, Finished, PairSpec, SpeculationStats, TextAssembler
from inference.engines.exact import ExactEngine
from inference.engines.library import PairEngine

PROMPTS_FILE = Path(__file__).resolve().parents[1] / "prompts" / "heldout.json"
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

    def params(self, max_new_tokens: int) -> DecodingParams:
        """A fixed number of tokens (EOS ignored) so every variant does the same work."""
        return DecodingParams(max_new_tokens=max_new_tokens, ignore_eos=True, temperature=self.temperature,
                              seed=self.seed, num_assistant_tokens=self.num_assistant_tokens,
                              assistant_confidence_threshold=self.assistant_confidence_threshold)

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
ADAPTIVE = "adaptive"  # through the stack: a request that names no K, planned by the worker for its load


def k_variant(k: int) -> Variant:
    return Variant(f"K={k}", True, num_assistant_tokens=k)


def threshold_variant(threshold: float) -> Variant:
    return Variant(f"threshold={threshold:g}", True, assistant_confidence_threshold=threshold)


def default_variants(*, ks=range(1, 9), thresholds=(0.3, 0.5)) -> list[Variant]:
    return [PLAIN] + [k_variant(k) for k in ks] + [threshold_variant(t) for t in thresholds]


def sampled_variants(*, ks, temperature: float) -> list[Variant]:
    """The main alone and the exact engine for each K, at one temperature, seeded so reruns repeat."""
    return [Variant(f"T={temperature:g} plain", False, temperature=temperature, seed=7)] + [
        Variant(f"T={temperature:g} K={k}", True, num_assistant_tokens=k, temperature=temperature, seed=7) for k in ks]


@dataclass(frozen=True)
class Prompt:
    text: str
    set: str = ""


WORDS = re.compile(r"\w+|[^\w\s]")  # words and single punctuation marks: code and prose alike, no tokenizer needed


def repeated_ngram_share(text: str, n: int = 4) -> float:
    """The share of the text's n-grams (of words and punctuation marks) already seen earlier in it:
    about 0 for ordinary prose or code, towards 1 for an answer stuck in a loop, which any draft
    predicts and whose acceptance says nothing about real answers."""
    words = WORDS.findall(text)
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return 0.0
    seen: set[tuple[str, ...]] = set()
    repeated = 0
    for gram in grams:
        repeated += gram in seen
        seen.add(gram)
    return repeated / len(grams)


def prompts_from_file(path: Path, *, render_chat: Callable[[list[dict]], str]) -> list[Prompt]:
    """A user's prompts: a JSON list or JSON Lines, each item a string, {"prompt": text} or {"messages":
    [{"role", "content"}, ...]} (rendered with `render_chat`, the pair's chat template). The set is
    named after the file. ValueError naming the item for anything else."""
    raw = path.read_text(encoding="utf-8")
    try:
        items = json.loads(raw) if raw.lstrip().startswith("[") else [
            json.loads(line) for line in raw.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path.name}: not JSON or JSON Lines ({exc})") from exc
    if not items:
        raise ValueError(f"{path.name}: no prompts")
    prompts = []
    for index, item in enumerate(items, 1):
        if isinstance(item, dict) and isinstance(item.get("messages"), list):
            text = render_chat(item["messages"])
        else:
            text = item.get("prompt") if isinstance(item, dict) else item
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{path.name}, item {index}: expected a non-empty string, {{\"prompt\": text}} or "
                             f"{{\"messages\": [...]}}")
        prompts.append(Prompt(text, path.stem))
    return prompts


def heldout_prompts(*, sets: tuple[str, ...] = ("code", "prose"), per_set: int | None = None) -> list[Prompt]:
    """The held-out prompts kept in the repo (the demo pair never saw them), the first `per_set` of each set."""
    data = json.loads(PROMPTS_FILE.read_text())
    unknown = [s for s in sets if not isinstance(data.get(s), list)]
    if unknown:
        raise ValueError(f"no prompt set {', '.join(unknown)} in {PROMPTS_FILE.name}")
    return [Prompt(text, name) for name in sets for text in data[name][:per_set]]


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
        return {"prompt": self.prompt.text, "set": self.prompt.set, "repeat": self.repeat, "tokens": self.tokens,
                "duration_s": self.duration_s, "tokens_per_s": self.tokens_per_s, "ttft_ms": self.ttft_ms,
                "token_latency_ms": self.token_latency_ms, "main_steps": self.main_steps,
                "accepted": self.accepted, "proposed": self.proposed, "generation_id": self.generation_id,
                "sent_wall": self.sent_wall, "path": self.path}


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
    backend and scheduler settings), and the draft alone for the cost ratio. `get` gives the
    engine for a spec (a worker passes its registry's); without it each is built once here and
    freed by `close`."""

    def __init__(self, spec: PairSpec, get: Callable[[PairSpec], Engine] | None = None):
        self.spec = spec
        self._get = get
        self._built: dict[PairSpec, Engine] = {}

    def _engine(self, spec: PairSpec) -> Engine:
        if self._get:
            return self._get(spec)
        if spec not in self._built:
            self._built[spec] = ExactEngine(spec) if spec.exact_sampling else PairEngine(spec)
        return self._built[spec]

    def pair(self, *, speculative: bool, exact_sampling: bool = False) -> Engine:
        return self._engine(replace(self.spec, speculative=speculative,
                                    exact_sampling=exact_sampling and bool(self.spec.draft_dir)))

    def draft_alone(self) -> PairEngine:
        return self._engine(replace(self.spec, slug=f"{self.spec.slug}-draft-alone", main_dir=self.spec.draft_dir,
                                    draft_dir="", prompt_lookup=False, speculative=False))

    def close(self) -> None:
        for engine in self._built.values():
            engine.close()
        self._built.clear()


TOKEN_TIMEOUT_S = 300  # a generation silent this long is not coming back


def run_once(engine: Engine, *, prompt: str, params: DecodingParams) -> tuple[str, SpeculationStats, float]:
    """One generation on an engine: its text, step stats, and when it was submitted."""
    speculative = engine.spec.uses_draft or engine.spec.uses_prompt_lookup
    fixed_k = params.num_assistant_tokens if params.assistant_confidence_threshold is None else None
    stats = SpeculationStats(num_assistant_tokens=fixed_k if speculative else None, speculative=speculative,
                             max_new_tokens=params.max_new_tokens)
    text = TextAssembler(engine.tokenizer)
    request = engine.submit(prompt=prompt, params=params)
    try:
        while not isinstance(item := request.events.get(timeout=TOKEN_TIMEOUT_S), Finished):
            stats.add_step(len(item.token_ids), item.at)
            text.add(item.token_ids)
    except queue.Empty:
        raise TimeoutError(f"The benchmark stopped: the engine wrote no token for {TOKEN_TIMEOUT_S} s (an "
                           "overloaded worker, or an engine that hangs).") from None
    if item.finish_reason == "error":
        raise RuntimeError(item.error)
    text.finish()
    return text.text, stats, request.added_at


class InProcessPath:
    name = INPROCESS

    def __init__(self, engines: Engines):
        self.engines = engines

    def run(self, *, prompt: Prompt, variant: Variant, max_new_tokens: int) -> Sample:
        # Sampled speculative variants run where the product runs them: on the exact engine.
        engine = self.engines.pair(speculative=variant.speculative,
                                   exact_sampling=variant.speculative and variant.temperature > 0)
        text, stats, started = run_once(engine, prompt=prompt.text, params=variant.params(max_new_tokens))
        decode_s = (stats.last_token_at or started) - (stats.first_token_at or started)
        speculative = engine.spec.uses_draft or engine.spec.uses_prompt_lookup
        return Sample(
            prompt=prompt, text=text, tokens=stats.tokens, started_at=started,
            duration_s=(stats.last_token_at or started) - started,
            ttft_ms=(stats.first_token_at - started) * 1000 if stats.first_token_at else None,
            token_latency_ms=decode_s * 1000 / (stats.tokens - 1) if stats.tokens > 1 else None,
            main_steps=stats.main_steps,
            accepted=stats.accepted if speculative else None,
            proposed=stats.proposed if speculative and stats.num_assistant_tokens else None,
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
    *, spec: PairSpec | None = None, engines: Engines | None = None, prompts: list[str | Prompt],
    variants: list[Variant], max_new_tokens: int = 128, repeats: int = 3, progress: Progress | None = None,
) -> dict[str, VariantResult]:
    """The in-process part alone (the demo-pair builder uses it to choose K). Engines built here
    from `spec` are freed at the end; pass `engines` to share them with draft_cost_ratio."""
    own = engines is None
    engines = engines or Engines(spec)
    try:
        return measure(plan=[(InProcessPath(engines), variants)], max_new_tokens=max_new_tokens, repeats=repeats,
                       prompts=[p if isinstance(p, Prompt) else Prompt(p) for p in prompts],
                       progress=progress)[INPROCESS]
    finally:
        if own:
            engines.close()


def draft_cost_ratio(*, spec: PairSpec | None = None, engines: Engines | None = None, prompt: str,
                     max_new_tokens: int = 64, repeats: int = 3) -> float:
    """Time per token of the draft alone over the main alone (plain pipelines, same settings), interleaved."""
    own = engines is None
    engines = engines or Engines(spec)
    try:
        alone = {"main": engines.pair(speculative=False), "draft": engines.draft_alone()}
        times: dict[str, list[float]] = {"main": [], "draft": []}
        params = DecodingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
        for engine in alone.values():  # warm-up
            run_once(engine, prompt=prompt, params=replace(params, max_new_tokens=4))
        for _ in range(repeats):
            for name, engine in alone.items():
                _, stats, _ = run_once(engine, prompt=prompt, params=params)
                times[name].append((stats.last_token_at - stats.first_token_at) / max(stats.tokens - 1, 1))
        return statistics.median(times["draft"]) / statistics.median(times["main"])
    finally:
        if own:
            engines.close()


def expected_tokens_per_step(acceptance: float, k: int) -> float:
    if acceptance >= 1:
        return k + 1.0
    return (1 - acceptance ** (k + 1)) / (1 - acceptance)


# ------------------------------------------------------------------ summaries
def summarize(results: dict[str, VariantResult], *, cost_ratio: float | None = None,
              reference: dict[str, str] | None = None, path: str = INPROCESS, prompt_set: str = "",
              plain_name: str = PLAIN.name, greedy: bool = True) -> list[dict]:
    """One row per variant: medians over all samples and the spread of the repeats' medians,
    speedup over this path's plain (a ratio of medians), the theory (Leviathan et al.) for
    fixed K, and whether every text equals `reference` (the main alone's text per prompt; by
    default this path's own plain run). Sampled runs are not compared text by text (the
    distribution test covers them)."""
    plain = results.get(plain_name)
    if not greedy:
        reference = None
    elif reference is None:
        reference = _first_texts(plain) if plain else None
    base = _median(plain.tokens_per_s) if plain else None
    base_step = _median(plain.step_ms) if plain else None
    rows = []
    for name, r in results.items():
        if not r.samples:
            continue
        tps = statistics.median(r.tokens_per_s)
        step = _median(r.step_ms)
        k = r.variant.num_assistant_tokens
        row = {
            "path": path,
            "set": prompt_set,
            "variant": name,
            "temperature": r.variant.temperature,
            "speculative": r.variant.speculative,
            "k": k,
            "threshold": r.variant.assistant_confidence_threshold,
            "samples": len(r.samples),
            "tokens_per_s": tps,
            "tokens_per_s_spread": [min(r.tokens_per_s_by_repeat), max(r.tokens_per_s_by_repeat)],
            "ttft_ms_p50": percentile(r.ttft_ms, 50),
            "ttft_ms_p95": percentile(r.ttft_ms, 95),
            "token_latency_ms_p50": percentile(r.token_latency_ms, 50),
            "token_latency_ms_p95": percentile(r.token_latency_ms, 95),
            "acceptance_rate": r.acceptance_rate,
            "repeated_4gram_share": statistics.median(repeated_ngram_share(x.text) for x in r.samples),
            "mean_accepted_length": r.mean_accepted_length,
            "speedup": tps / base if base else None,
            "step_ms": step,
            "step_cost": step / base_step if step and base_step else None,
            "identical_to_plain": (all(reference.get(s.prompt.text) == s.text for s in r.samples)
                                   if reference is not None else None),
        }
        expected = r.expected_tokens_per_step
        if cost_ratio is not None and expected is not None:
            row["expected_tokens_per_step"] = expected
            row["theoretical_step_cost"] = 1 + k * cost_ratio
            row["theoretical_speedup"] = expected / (1 + k * cost_ratio)
            row["of_theoretical"] = row["speedup"] / row["theoretical_speedup"] if row["speedup"] else None
        rows.append(row)
    return rows


LOOPING = 0.3  # a median repeated 4-gram share above this: answers loop


def loop_warning(results: dict[str, VariantResult], *, plain_name: str = PLAIN.name) -> str | None:
    """A warning when the main alone's answers loop (acceptance is then carried by the loops), with
    each speculative variant's acceptance on the least repetitive half of the prompts beside all."""
    plain = results.get(plain_name)
    shares: dict[str, float] = {}
    for sample in plain.samples if plain else []:
        shares.setdefault(sample.prompt.text, repeated_ngram_share(sample.text))
    if not shares or statistics.median(shares.values()) <= LOOPING:
        return None
    calm = set(sorted(shares, key=shares.__getitem__)[:max(1, len(shares) // 2)])
    figures = []
    for name, result in results.items():
        subset = VariantResult(result.variant, [x for x in result.samples if x.prompt.text in calm])
        if result.acceptance_rate is not None and subset.acceptance_rate is not None:
            figures.append(f"{name} {subset.acceptance_rate:.2f} (all prompts {result.acceptance_rate:.2f})")
    return (f"Outputs loop: the main alone's median repeated 4-gram share is {statistics.median(shares.values()):.2f} "
            f"(above {LOOPING}), and loops are easy to predict. Acceptance on the {len(calm)} least repetitive "
            f"prompts: {', '.join(figures) or 'no speculative variant'}.")


def _first_texts(result: VariantResult) -> dict[str, str]:
    texts: dict[str, str] = {}
    for s in result.samples:
        texts.setdefault(s.prompt.text, s.text)
    return texts


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def percentile(values: list[float], pct: int) -> float | None:
    """Nearest-rank percentile, None for no values."""
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    return values[min(len(values) - 1, round(pct / 100 * (len(values) - 1)))]


def compare_to_inprocess(rows: list[dict], results: dict[str, dict[str, VariantResult]]) -> list[dict]:
    """Each row of another path gets its ratios to the same variant in-process: tokens/s, speedup,
    and the TTFT the path adds at p50: the median of its differences to the in-process TTFT of the same
    prompt and repeat, which were run one after the other (a difference of two medians moved by tens of
    ms with which prompts fell in the middle)."""
    inprocess = {r["variant"]: r for r in rows if r["path"] == INPROCESS and not r["set"]}
    for row in rows:
        base = inprocess.get(row["variant"])
        if row["path"] == INPROCESS or base is None:
            continue
        row["tokens_per_s_vs_inprocess"] = row["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else None
        row["ttft_added_ms_p50"] = _median(ttft_added(results[row["path"]][row["variant"]],
                                                      results[INPROCESS][row["variant"]]))
        row["speedup_vs_inprocess"] = (row["speedup"] / base["speedup"]
                                       if row["speculative"] and row["speedup"] and base["speedup"] else None)
    return rows


def ttft_added(path: VariantResult, inprocess: VariantResult) -> list[float]:
    """Per prompt and repeat, the path's TTFT minus the in-process one."""
    base = {(s.prompt.text, s.repeat): s.ttft_ms for s in inprocess.samples if s.ttft_ms is not None}
    return [s.ttft_ms - base[s.prompt.text, s.repeat] for s in path.samples
            if s.ttft_ms is not None and (s.prompt.text, s.repeat) in base]


Column = tuple[str, str, str]  # (header, key, format)
TABLE_COLUMNS: tuple[Column, ...] = (
    ("path", "path", ""), ("variant", "variant", ""), ("tok/s (spread)", "tokens_per_s", ".1f"),
    ("speedup", "speedup", ".2f"), ("theory", "theoretical_speedup", ".2f"), ("of theory", "of_theoretical", ".0%"),
    ("accept", "acceptance_rate", ".2f"), ("loops", "repeated_4gram_share", ".2f"),
    ("len", "mean_accepted_length", ".2f"), ("step cost", "step_cost", ".2f"),
    ("theory cost", "theoretical_step_cost", ".2f"), ("TTFT p50", "ttft_ms_p50", ".1f"),
    ("TTFT p95", "ttft_ms_p95", ".1f"), ("lat p50", "token_latency_ms_p50", ".2f"),
    ("lat p95", "token_latency_ms_p95", ".2f"), ("same", "identical_to_plain", ""),
)


def cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    spread = row.get(f"{key}_spread")
    if spread:
        return f"{value:{fmt}} ({spread[0]:.0f}-{spread[1]:.0f})"
    return format(value, fmt) if fmt else str(value)


def table(rows: list[dict], columns: tuple[Column, ...] = TABLE_COLUMNS) -> list[list[str]]:
    """The header and one line of cells per row."""
    return [[h for h, _, _ in columns]] + [[cell(r, k, f) for _, k, f in columns] for r in rows]


def print_table(rows: list[dict], out=print, columns: tuple[Column, ...] = TABLE_COLUMNS) -> None:
    lines = table(rows, columns)
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    for line in lines:
        out("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=False)))


def timestamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")
