"""A pair's speculation profile: the best K at each number of concurrent streams, measured through
the stack, greedy and sampled. Verifying K+1 tokens is nearly free while a step is memory-bound; as
streams join the batch the step turns compute-bound and the draft's work costs real time, so the
best K falls with load, down to 0 (the main alone). Workers plan each request's K from this table
(inference.serving.speculation); the validation sweep then compares three lines at every load: the
main alone, the best fixed K, and adaptive (requests that name no K)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from django.utils import timezone

from inference.benchmark.inprocess import ADAPTIVE, PLAIN, Progress, Variant, k_variant, timestamp
from inference.benchmark.prompts import Prompt
from inference.benchmark.stack import StreamFn
from inference.benchmark.sweeps import concurrency_sweep, steady_sweep, summarize_concurrency
from inference.models import BenchmarkRun, ModelPair
from inference.serving.planning.choice import quickest_k

SAMPLED_TEMPERATURE = 0.8
LOADS = ("bursts", "steady")


@dataclass(frozen=True, kw_only=True)
class ProfileOptions:
    levels: tuple[int, ...] = (1, 2, 4, 8, 16)
    ks: tuple[int, ...] = (2, 3, 4, 6)
    max_new_tokens: int = 96
    repeats: int = 1
    sampled: bool = True
    load: str = "bursts"  # or "steady": N clients that ask again as soon as their answer ends (sweeps.steady_sweep)
    rounds: int = 6  # answers each client asks under a steady load


def sweep_under_load(*, stream: StreamFn, prompts: list[Prompt], options: ProfileOptions, variants: list[Variant],
                     progress: Progress | None = None) -> list[dict]:
    """Rows per variant and streams (throughput, per repeat, and the paths answers were served on) under
    the options' load: bursts of N requests at once (the worst case for time to first token, every
    prefill together), or a steady N (a team's load, where requests join a running batch; the two can
    rank the paths differently)."""
    if options.load == "steady":
        return steady_sweep(stream=stream, prompts=prompts, levels=list(options.levels), variants=variants,
                            max_new_tokens=options.max_new_tokens, rounds=options.rounds, repeats=options.repeats,
                            progress=progress)
    return summarize_concurrency(concurrency_sweep(
        stream=stream, prompts=prompts, levels=list(options.levels), variants=variants,
        max_new_tokens=options.max_new_tokens, repeats=options.repeats, progress=progress))


def variants(*, ks: tuple[int, ...], temperature: float) -> list[Variant]:
    seed = 7 if temperature else None
    plain = Variant(PLAIN.name, False, temperature=temperature, seed=seed)
    return [plain] + [Variant(k_variant(k).name, True, num_assistant_tokens=k, temperature=temperature, seed=seed)
                      for k in ks]


# Speculation must beat the main alone by this much in the sweep to be chosen: one burst per cell
# moves from run to run by about this much on a shared host (docs/benchmark.md#how-to-measure), the main alone
# batches every request (the own engine does not), and the promise is never to be slower than the main alone.
MARGIN_OVER_PLAIN = 1.10


def best_k_by_level(rows: list[dict], *, margin: float = MARGIN_OVER_PLAIN) -> dict[str, int]:
    """{streams: K}: at each level the fastest K (quickest_k: the smallest as fast) of those that beat the
    main alone by `margin`, else 0."""
    best: dict[str, int] = {}
    for level in sorted({row["concurrency"] for row in rows}):
        at_level = {int(row["variant"].removeprefix("K=")): row["throughput"]
                    for row in rows if row["concurrency"] == level and row["variant"] != PLAIN.name}
        plain = next((row["throughput"] for row in rows if row["concurrency"] == level
                      and row["variant"] == PLAIN.name), 0.0)
        winning = {k: rate for k, rate in at_level.items() if rate >= margin * plain}
        best[str(level)] = quickest_k(winning) if winning else 0
    return best


def best_fixed_k(rows: list[dict]) -> int:
    """The one K with the best throughput over plain, averaged over levels (what a fixed setting gives)."""
    plain = {r["concurrency"]: r["throughput"] for r in rows if r["variant"] == PLAIN.name}
    gains: dict[int, list[float]] = {}
    for row in rows:
        if row["variant"] != PLAIN.name:
            gains.setdefault(int(row["variant"].removeprefix("K=")), []).append(
                row["throughput"] / plain[row["concurrency"]])
    return max(gains, key=lambda k: statistics.mean(gains[k]))


def measure_profile(*, stream: StreamFn, prompts: list[Prompt], options: ProfileOptions,
                    progress: Progress | None = None) -> dict:
    """Sweep K x streams per decoding mode, then validate: main alone vs best fixed K vs adaptive.
    The profile is written to the pair between the two sweeps (the adaptive line runs on it)."""
    modes = {"greedy": 0.0, **({"sampled": SAMPLED_TEMPERATURE} if options.sampled else {})}
    sweeps = {}
    for mode, temperature in modes.items():
        rows = sweep_under_load(stream=stream, prompts=prompts, options=options,
                                variants=variants(ks=options.ks, temperature=temperature), progress=progress)
        sweeps[mode] = {"rows": rows, "profile": best_k_by_level(rows), "best_fixed_k": best_fixed_k(rows)}
    return sweeps


def stored_sweeps(*, pair: ModelPair, options: ProfileOptions) -> dict:
    """What validate_profile needs of a sweep, from the profile stored on the pair: its modes, and as the
    best fixed K the one its last profile run found (else the largest K the profile uses)."""
    if not pair.speculation_profile:
        raise ValueError(f"'{pair.slug}' has no stored profile: run profile_pair without --validate-only first")
    last_run = (pair.profile_run.results.get("sweeps", {}) if pair.profile_run else {})
    modes = [mode for mode in pair.speculation_profile if mode == "greedy" or options.sampled]
    return {mode: {"best_fixed_k": last_run.get(mode, {}).get("best_fixed_k")
                   or max([*pair.speculation_profile[mode].values(), 1])} for mode in modes}


def validate_profile(*, stream: StreamFn, prompts: list[Prompt], options: ProfileOptions, sweeps: dict,
                     progress: Progress | None = None) -> dict:
    """Three lines at every level, per mode: the main alone, the best fixed K, adaptive."""
    lines = {}
    for mode, sweep in sweeps.items():
        temperature = SAMPLED_TEMPERATURE if mode == "sampled" else 0.0
        seed = 7 if temperature else None
        fixed = sweep["best_fixed_k"]
        candidates = [Variant(PLAIN.name, False, temperature=temperature, seed=seed),
                      Variant(f"K={fixed}", True, num_assistant_tokens=fixed, temperature=temperature, seed=seed),
                      Variant(ADAPTIVE, True, temperature=temperature, seed=seed)]
        lines[mode] = sweep_under_load(stream=stream, prompts=prompts, options=options, variants=candidates,
                                       progress=progress)
    return lines


AT_LEAST_FIXED = 0.95  # adaptive keeps at least this share of the best fixed K's throughput (the bar)


def paired_ratio(line: list[float], other: list[float]) -> tuple[float | None, list[float]]:
    """(median, [min, max]) over repeats of line / other in the same repeat: each repeat runs the lines
    back to back, and the host's speed drifts from one minute to the next more than within one. None where the
    other line delivered no tokens in any repeat (its answers failed: its rows say how)."""
    ratios = [a / b for a, b in zip(line, other, strict=True) if b]
    if not ratios:
        return None, []
    return statistics.median(ratios), [min(ratios), max(ratios)]


def adaptive_bars(lines: dict) -> list[dict]:
    """Issue bars: at every level adaptive >= the main alone and >= 0.95x the best fixed K, by paired
    ratios. A cell short of a bar only where adaptive served every answer on the very path of the line
    it is compared with is a "same path" verdict, not a pass: the gap is two runs of one path apart."""
    bars = []
    for mode, rows in lines.items():
        by = {(r["variant"], r["concurrency"]): r for r in rows}
        for level in sorted({r["concurrency"] for r in rows}):
            adaptive, plain = by[(ADAPTIVE, level)], by[(PLAIN.name, level)]
            fixed = next(r for (name, lv), r in by.items() if lv == level and name.startswith("K="))
            vs_plain, plain_range = paired_ratio(adaptive["throughput_by_repeat"], plain["throughput_by_repeat"])
            vs_fixed, fixed_range = paired_ratio(adaptive["throughput_by_repeat"], fixed["throughput_by_repeat"])
            if vs_plain is None or vs_fixed is None:
                verdict = "unmeasured"  # a line's answers failed in every repeat: nothing to weigh
            else:
                bars_met = ((PLAIN.name, vs_plain >= 1.0), (fixed["variant"], vs_fixed >= AT_LEAST_FIXED))
                short = [name for name, met in bars_met if not met]
                same_path = bool(short) and all(set(adaptive["paths"]) == {name} for name in short)
                verdict = "pass" if not short else "same path" if same_path else "miss"
            bars.append({"mode": mode, "streams": level, "adaptive": adaptive["throughput"],
                         "plain": plain["throughput"], "best_fixed": fixed["throughput"],
                         "fixed_variant": fixed["variant"], "vs_plain": vs_plain, "vs_plain_range": plain_range,
                         "vs_fixed": vs_fixed, "vs_fixed_range": fixed_range, "adaptive_paths": adaptive["paths"],
                         "pass": verdict == "pass", "verdict": verdict})
    return bars


def set_profile(*, pair: ModelPair, sweeps: dict) -> None:
    """New requests that name no K follow this profile from now on (workers read it per request)."""
    pair.speculation_profile = {mode: sweep["profile"] for mode, sweep in sweeps.items()}
    pair.save(update_fields=["speculation_profile"])


def record_profile_run(*, pair: ModelPair, sweeps: dict, lines: dict, options: ProfileOptions) -> BenchmarkRun:
    """Keep the run the profile came from; the admin shows it beside the pair's profile."""
    results = {"kind": "profile", "finished_at": timestamp(), "options": asdict(options),
               "sweeps": sweeps, "lines": lines, "bars": adaptive_bars(lines)}
    run = BenchmarkRun.objects.create(pair=pair, status=BenchmarkRun.Status.FINISHED, options=asdict(options),
                                      results=results, progress="done", finished_at=timezone.now())
    pair.profile_run = run
    pair.save(update_fields=["profile_run"])
    return run
