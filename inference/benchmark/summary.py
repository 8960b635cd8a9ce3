"""A benchmark's results as rows and tables: medians, spreads, speedups next to the theory, whether
answers stayed identical, and a warning when they loop."""
from __future__ import annotations

import statistics

from inference.benchmark.inprocess import INPROCESS, PLAIN, Sample, VariantResult
from inference.benchmark.prompts import repeated_ngram_share
from inference.limits import Route


def summarize(results: dict[str, VariantResult], *, cost_ratio: float | None = None,
              reference: dict[str, str] | None = None, own_reference: dict[str, str] | None = None,
              path: str = INPROCESS, prompt_set: str = "", plain_name: str = PLAIN.name,
              greedy: bool = True) -> list[dict]:
    """One row per variant: medians over all samples and the spread of the repeats' medians,
    speedup over this path's plain (a ratio of medians), the theory (Leviathan et al.) for
    fixed K, and how many texts differ from the main alone's text per prompt: `reference` (by
    default this path's own plain run), or `own_reference` for an answer the own engine served
    (its main alone's). Sampled runs are not compared text by text (the distribution test covers them)."""
    plain = results.get(plain_name)
    if not greedy:
        reference = None
    elif reference is None:
        reference = first_texts(plain) if plain else None
    base = _median(plain.tokens_per_s) if plain else None
    base_step = _median(plain.step_ms) if plain else None
    rows = []
    for name, r in results.items():
        if not r.samples:
            continue
        tps = statistics.median(r.tokens_per_s)
        step = _median(r.step_ms)
        k = r.variant.num_assistant_tokens
        speedup = tps / base if base else None
        differing = (sum(_main_alone_text(s, reference, own_reference) != s.text for s in r.samples)
                     if reference is not None else None)
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
            "speedup": speedup,
            "step_ms": step,
            "step_cost": step / base_step if step and base_step else None,
            "identical_to_plain": differing == 0 if differing is not None else None,
            "texts_differing_from_plain": differing,
        }
        expected = r.expected_tokens_per_step
        if cost_ratio is not None and expected is not None and k:
            theory = expected / (1 + k * cost_ratio)
            row["expected_tokens_per_step"] = expected
            row["theoretical_step_cost"] = 1 + k * cost_ratio
            row["theoretical_speedup"] = theory
            row["of_theoretical"] = speedup / theory if speedup else None
        rows.append(row)
    return rows


def _main_alone_text(sample: Sample, reference: dict[str, str], own_reference: dict[str, str] | None) -> str | None:
    if own_reference is not None and sample.route and Route(sample.route).is_own_engine():
        return own_reference.get(sample.prompt.text)
    return reference.get(sample.prompt.text)


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


def first_texts(result: VariantResult) -> dict[str, str]:
    """Each prompt's first answer in a line (its repeats give the same text where the line is greedy)."""
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
