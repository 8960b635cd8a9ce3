"""What a benchmark run says: the issue's bars (PASS/MISS and by how much), the tables as text and
markdown, and the PNG plots, all from the results dict that `runs.run_benchmark` returns
(and that results.json keeps), so a report can be redrawn from the JSON alone."""

from __future__ import annotations

import json
from pathlib import Path

from inference.benchmark.inprocess import ADAPTIVE, INPROCESS, PEER, PLAIN
from inference.benchmark.summary import TABLE_COLUMNS, Column, print_table, table

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
PLOTS = ("speedup_vs_k.png", "speedup_vs_concurrency.png", "latency.png")

# The bars, measured on the demo pair on this 2-core machine.
STACK_TOKENS_PER_S = 0.95  # stack tokens/s over in-process, same variant
STACK_TTFT_ADDED_MS = 25.0  # TTFT the stack adds at p50
STACK_SPEEDUP = 0.95  # speedup through the stack over the speedup in-process
SCALING_AT = 8
SCALING = 2.5  # throughput of 8 streams over 1 stream
OF_THEORETICAL = 0.8  # measured over theoretical speedup at the best K
DEMO_ACCEPTANCE = 0.60  # the demo pair: draft acceptance at the best K on held-out code
DEMO_SPEEDUP = 1.5  # the demo pair: speculative over the main alone at concurrency 1
TTFT_UNDER_LOAD = 2.0  # TTFT p50 at steady load over TTFT p50 at one stream ...
TTFT_UNDER_LOAD_AT = (4, 8)  # ... at these numbers of streams
PEER_SPEEDUP = 1.2  # the pair as it ships over another server's line (issue 35) ...
PEER_BAR_AT = (1, 4)  # ... at these numbers of streams

CONCURRENCY_COLUMNS: tuple[Column, ...] = (
    ("variant", "variant", ""), ("streams at once", "concurrency", ""), ("tok/s total (spread)", "throughput", ".1f"),
    ("scaling vs 1", "scaling", ".2f"), ("spec/plain", "speedup", ".2f"),
    ("stream tok/s p50", "stream_tokens_per_s_p50", ".1f"), ("TTFT p50", "ttft_ms_p50", ".1f"),
    ("TTFT p95", "ttft_ms_p95", ".1f"), ("lat p50", "token_latency_ms_p50", ".2f"),
    ("lat p95", "token_latency_ms_p95", ".2f"), ("lost", "lost", ""), ("failed", "failed", ""),
)
STEADY_COLUMNS: tuple[Column, ...] = (
    ("variant", "variant", ""), ("streams", "concurrency", ""), ("requests counted", "requests", ""),
    ("TTFT p50", "ttft_ms_p50", ".1f"), ("TTFT p95", "ttft_ms_p95", ".1f"), ("TTFT vs 1 stream", "ttft_vs_one", ".2f"),
    ("stream tok/s p50", "stream_tokens_per_s_p50", ".1f"), ("tok/s total", "throughput", ".1f"),
    ("failed", "failed", ""),
)
STEADY_TITLE = "Steady load: requests arrive while others run"
SET_COLUMNS: tuple[Column, ...] = (("set", "set", ""), *tuple(c for c in TABLE_COLUMNS if c[1] != "path"))
PROFILE_COLUMNS: tuple[Column, ...] = (
    ("path", "path", ""), ("generations", "samples", ""), ("web", "web_ms_p50", ".1f"),
    ("queue", "queue_ms_p50", ".1f"),
    ("engine", "engine_ms_p50", ".1f"), ("delivery", "delivery_ms_p50", ".1f"), ("TTFT", "total_ms_p50", ".1f"),
)
SAMPLED_COLUMNS: tuple[Column, ...] = (
    ("variant", "variant", ""), ("tok/s", "tokens_per_s", ".1f"), ("speedup", "speedup", ".2f"),
    ("acceptance", "acceptance_rate", ".2f"), ("loops", "repeated_4gram_share", ".2f"),
    ("tokens/step", "mean_accepted_length", ".2f"),
    ("TTFT p50", "ttft_ms_p50", ".1f"), ("chosen", "chosen", ""),
)
PEER_COLUMNS: tuple[Column, ...] = (
    ("streams at once", "concurrency", ""), ("SpecChat as it ships, tok/s", "shipped", ".1f"),
    ("SpecChat main alone, tok/s", "main_alone", ".1f"), ("peer, tok/s", "peer", ".1f"),
    ("as it ships / peer", "ratio", ".2f"), ("peer lost or failed", "peer_lost_or_failed", ""),
)
STACK_COLUMNS: tuple[Column, ...] = (
    ("path", "path", ""), ("variant", "variant", ""), ("tok/s vs in-process", "tokens_per_s_vs_inprocess", ".2f"),
    ("TTFT added p50 (ms)", "ttft_added_ms_p50", ".1f"), ("speedup vs in-process", "speedup_vs_inprocess", ".2f"),
)


def _bar(name: str, measured: float | None, op: str, target: float, unit: str) -> dict:
    if measured is None:
        passed, margin = None, None
    else:
        margin = measured - target if op == ">=" else target - measured
        passed = margin >= 0
    return {"bar": name, "measured": measured, "op": op, "target": target, "unit": unit, "passed": passed,
            "margin": margin}


def side_by_side(concurrency: list[dict]) -> list[dict]:
    """Per number of streams: the pair as it ships (requests naming no K; the main alone for a pair without
    a draft), SpecChat's main alone and the peer, aggregate tokens/s from the same interleaved bursts."""
    by = {(r["variant"], r["concurrency"]): r for r in concurrency}
    rows = []
    for level in sorted({r["concurrency"] for r in concurrency}):
        peer, plain = by.get((PEER.name, level)), by.get((PLAIN.name, level))
        shipped = by.get((ADAPTIVE, level)) or plain
        if peer is None or shipped is None:
            continue
        rows.append({"concurrency": level, "shipped": shipped["throughput"],
                     "main_alone": plain["throughput"] if plain else None, "peer": peer["throughput"],
                     "ratio": shipped["throughput"] / peer["throughput"] if peer["throughput"] else None,
                     "peer_lost_or_failed": peer["lost"] + peer["failed"]})
    return rows


def _peer_title(results: dict) -> str:
    peer = results["peer"]
    return f"Beside {peer['model']} at {peer['url']} (same prompts, settings and bursts, interleaved)"


def evaluate_bars(results: dict) -> list[dict]:
    rows = [r for r in results["rows"] if not r["set"]]
    bars = []
    for row in (r for r in rows if r["path"] not in (INPROCESS, PEER.name)):
        label = f"{row['path']} {row['variant']}"
        bars.append(_bar(f"{label}: tokens/s vs in-process", row.get("tokens_per_s_vs_inprocess"), ">=",
                         STACK_TOKENS_PER_S, "x"))
        bars.append(_bar(f"{label}: TTFT added by the stack at p50", row.get("ttft_added_ms_p50"), "<=",
                         STACK_TTFT_ADDED_MS, " ms"))
        if row["speculative"]:
            bars.append(_bar(f"{label}: speedup vs the speedup in-process", row.get("speedup_vs_inprocess"), ">=",
                             STACK_SPEEDUP, "x"))
    concurrency = results.get("concurrency") or []
    for row in concurrency:
        if row["concurrency"] == SCALING_AT:
            bars.append(_bar(f"{row['variant']}: throughput at {SCALING_AT} streams vs 1 stream", row["scaling"], ">=",
                             SCALING, "x"))
    for row in results.get("steady") or []:
        if row["concurrency"] in TTFT_UNDER_LOAD_AT:
            bars.append(_bar(f"{row['variant']}: TTFT p50 at a steady {row['concurrency']} streams vs 1 stream",
                             row["ttft_vs_one"], "<=", TTFT_UNDER_LOAD, "x"))
    if concurrency:
        bars.append(_bar("lost or failed streams in the concurrency sweep",
                         sum(r["lost"] + r["failed"] for r in concurrency)
                         + sum(r["failed"] for r in results.get("steady") or []), "<=", 0, ""))
    for row in (results.get("peer") or {}).get("side_by_side", []):
        if row["concurrency"] in PEER_BAR_AT:
            bars.append(_bar(f"as it ships vs {results['peer']['model']} at {row['concurrency']} stream(s)",
                             row["ratio"], ">=", PEER_SPEEDUP, "x"))
    ks = [r for r in rows if r["path"] == INPROCESS and r["k"] and r.get("speedup") is not None]
    if ks:
        best = max(ks, key=lambda r: r["speedup"])
        bars.append(_bar(f"best K ({best['variant']}, {best['speedup']:.2f}x): measured speedup of the theoretical",
                         best.get("of_theoretical"), ">=", OF_THEORETICAL, "x"))
        bars.append(_bar(f"best K ({best['variant']}): speedup over the main alone", best["speedup"], ">=",
                         DEMO_SPEEDUP, "x"))
        code = {r["variant"]: r for r in results.get("by_set", []) if r["set"] == "code" and r["path"] == INPROCESS}
        acceptance = (code.get(best["variant"]) or best).get("acceptance_rate")
        bars.append(_bar(f"best K ({best['variant']}): draft acceptance on held-out code", acceptance, ">=",
                         DEMO_ACCEPTANCE, ""))
        identical = sum(1 for r in rows if r["path"] == INPROCESS and r["speculative"] and not r["identical_to_plain"])
        bars.append(_bar("speculative variants whose greedy text differs from the main alone's", identical, "<=", 0,
                         ""))
    return bars


def bar_line(bar: dict) -> str:
    if bar["passed"] is None:
        return f"N/A   {bar['bar']}: not measured"
    unit, fmt = bar["unit"], ".2f" if isinstance(bar["measured"], float) else "d"
    how = f"margin {bar['margin']:{fmt}}{unit}" if bar["passed"] else f"missed by {-bar['margin']:{fmt}}{unit}"
    return (f"{'PASS' if bar['passed'] else 'MISS'}  {bar['bar']}: {bar['measured']:{fmt}}{unit} "
            f"(bar {bar['op']} {bar['target']:g}{unit}; {how})")


def scheduler_budget(results: dict) -> str:
    scheduler = results.get("scheduler") or {}
    budget = scheduler.get("budget") or "the library default, 256"
    how = "whole prompts prefilled first" if scheduler.get("prefill_first") else "prompts split and fused with decodes"
    return f"scheduler: {how}, up to {budget} tokens per step"


def print_report(results: dict, out=print) -> None:
    o = results["options"]
    m = results["machine"]
    out(f"\n{results['pair']} on {m['cpus']} CPU(s) ({m.get('cpu', '?')}), {o['max_new_tokens']} new tokens, "
        f"{o['repeats']} repeat(s); draft/main cost ratio {_fmt(results['cost_ratio'], '.3f')}; "
        f"{scheduler_budget(results)}\n")
    rows = [r for r in results["rows"] if not r["set"]]
    print_table(rows, out=out)
    if any(r["path"] != INPROCESS for r in rows):
        out("\nStack overhead (same variant as in-process):")
        print_table([r for r in rows if r["path"] != INPROCESS], out=out, columns=STACK_COLUMNS)
    if results.get("sampled"):
        out(f"\nSampled (T={o['sampled_temperature']:g}), the own engine vs the main alone in-process "
            f"(product's choice for a lone request: {_chosen(results)}):")
        print_table(results["sampled"], out=out, columns=SAMPLED_COLUMNS)
    if results["by_set"]:
        out("\nIn-process by prompt set:")
        print_table(results["by_set"], out=out, columns=SET_COLUMNS)
    if results["ttft_profile"]:
        out("\nWhere the stack's TTFT goes (p50, ms):")
        print_table(results["ttft_profile"], out=out, columns=PROFILE_COLUMNS)
    if results["concurrency"]:
        out(f"\nConcurrency ({o['concurrency_client']}):")
        print_table(results["concurrency"], out=out, columns=CONCURRENCY_COLUMNS)
    if results.get("steady"):
        out(f"\n{STEADY_TITLE} ({o['concurrency_client']}, {o['steady_rounds']} answers per client):")
        print_table(results["steady"], out=out, columns=STEADY_COLUMNS)
    if results.get("peer"):
        out(f"\n{_peer_title(results)}:")
        print_table(results["peer"]["side_by_side"], out=out, columns=PEER_COLUMNS)
    out("\nBars:")
    for bar in results["bars"]:
        out("  " + bar_line(bar))
    for note in results.get("notes", []):
        out(f"\nNote: {note}")


def _chosen(results: dict) -> str:
    return next((r["variant"] for r in results["sampled"] if r.get("chosen")), "none")


def _fmt(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def markdown_table(rows: list[dict], columns) -> str:
    lines = table(rows, columns)
    out = ["| " + " | ".join(lines[0]) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(line) + " |" for line in lines[1:]]
    return "\n".join(out)


def render_markdown(results: dict, *, plots: list[str]) -> str:
    o, m = results["options"], results["machine"]
    rows = [r for r in results["rows"] if not r["set"]]
    parts = [
        f"## Benchmark of `{results['pair']}`",
        (f"{results['started_at']} to {results['finished_at']}; {m['cpus']} CPU(s) "
         f"({m.get('cpu', 'CPU not recorded')}), "
        f"{m['platform']}, openvino-genai "
        f"{m['openvino_genai']}. {o['max_new_tokens']} new tokens per generation (greedy, EOS ignored), "
        f"{o['repeats']} repeat(s) over {results['prompts']} held-out prompt(s) ({', '.join(o['prompt_sets'])}), "
        f"variants interleaved. Draft/main cost ratio c = {_fmt(results['cost_ratio'], '.3f')}; "
        f"{scheduler_budget(results)}. "
        "tok/s is the median over generations (spread: the repeats' medians); speedup is over plain on the same path; "
        "theory is Leviathan et al.'s (1 - a^(K+1)) / ((1 - a)(1 + Kc)); step cost is a decoding step's time over a "
        "plain step's (theory: 1 + Kc); same = every text equals the main alone's."),
        markdown_table(rows, TABLE_COLUMNS),
    ]
    stack_rows = [r for r in rows if r["path"] != INPROCESS]
    if stack_rows:
        parts += ["### Stack overhead (same variant, through daphne + Redis + Celery worker)",
                  markdown_table(stack_rows, STACK_COLUMNS)]
    if results["ttft_profile"]:
        parts += ["### Where the stack's time to first token goes (p50, ms)",
                  ("web: from sending until the generation is recorded; queue: until a worker claims it; engine: the "
                  "first token in the batch; delivery: the rest (worker setup, the stream's flush interval, Redis, "
                  "the consumer or SSE view)."),
                  markdown_table(results["ttft_profile"], PROFILE_COLUMNS)]
    if results.get("sampled"):
        parts += [f"### Sampled (T = {o['sampled_temperature']:g}): the own engine vs the main alone, in-process",
                  (f"Speculative sampling by the exact rule (the library's own sampling with a draft is not exact and "
                  f"is not served). The product's choice for a lone request: {_chosen(results)}."),
                  markdown_table(results["sampled"], SAMPLED_COLUMNS)]
    if results["by_set"]:
        parts += ["### In-process by prompt set",
                  markdown_table(results["by_set"], SET_COLUMNS)]
    if results["concurrency"]:
        parts += [f"### Concurrency ({o['concurrency_client']}, one worker)",
                  markdown_table(results["concurrency"], CONCURRENCY_COLUMNS)]
    if results.get("steady"):
        parts += [f"### {STEADY_TITLE} ({o['concurrency_client']}, {o['steady_rounds']} answers per client)",
                  ("N clients each ask again as soon as their answer ends, their first requests spread over one lone "
                   "answer's time; answers are 0.5-1.5x the set length (the same lengths for every variant); counted "
                   "are the requests sent while every client was asking."),
                  markdown_table(results["steady"], STEADY_COLUMNS)]
    if results.get("peer"):
        parts += [f"### {_peer_title(results)}", markdown_table(results["peer"]["side_by_side"], PEER_COLUMNS)]
    parts += ["### Bars", "\n".join(f"- {bar_line(b)}" for b in results["bars"]) or "- none measured"]
    parts += [f"![{name}]({name})" for name in plots]
    if results.get("notes"):
        parts += ["### Notes", "\n".join(f"- {n}" for n in results["notes"])]
    return "\n\n".join(parts) + "\n"


# ------------------------------------------------------------------ plots
def write_plots(results: dict, out_dir: Path) -> list[str]:
    """The PNGs this run has data for: speedup vs K, speedup vs concurrency, latency distributions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    written = []
    rows = [r for r in results["rows"] if not r["set"]]
    k_rows = sorted((r for r in rows if r["k"]), key=lambda r: r["k"])
    if k_rows:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for path in dict.fromkeys(r["path"] for r in k_rows):
            points = [r for r in k_rows if r["path"] == path]
            ax.plot([r["k"] for r in points], [r["speedup"] for r in points], "o-" if path == INPROCESS else "s",
                    label=f"measured, {path}")
        theory = [r for r in k_rows if r["path"] == INPROCESS and r.get("theoretical_speedup") is not None]
        if theory:
            ax.plot([r["k"] for r in theory], [r["theoretical_speedup"] for r in theory], "--", color="gray",
                    label="theory (Leviathan et al.)")
        for r in rows:
            if r["path"] == INPROCESS and r["threshold"] is not None:
                ax.axhline(r["speedup"], linestyle=":", linewidth=1, label=f"{r['variant']}, in-process")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set(xlabel="K (draft tokens per step)", ylabel="speedup over plain",
               title=f"{results['pair']}: speedup vs K")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=8)
        written.append(_save(fig, out_dir, "speedup_vs_k.png"))
    concurrency = results.get("concurrency") or []
    if concurrency:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
        for variant in dict.fromkeys(r["variant"] for r in concurrency):
            points = sorted((r for r in concurrency if r["variant"] == variant), key=lambda r: r["concurrency"])
            left.plot([r["concurrency"] for r in points], [r["throughput"] for r in points], "o-", label=variant)
        spec = sorted((r for r in concurrency if r["variant"] != "plain" and r["speedup"] is not None),
                      key=lambda r: r["concurrency"])
        for variant in dict.fromkeys(r["variant"] for r in spec):
            points = [r for r in spec if r["variant"] == variant]
            right.plot([r["concurrency"] for r in points], [r["speedup"] for r in points], "o-", label=variant)
        right.axhline(1.0, color="black", linewidth=0.8)
        levels = sorted({r["concurrency"] for r in concurrency})
        for ax in (left, right):
            ax.set_xscale("log", base=2)
            ax.set_xticks(levels, [str(n) for n in levels])
            ax.set_xlabel("simultaneous streams")
            ax.legend(fontsize=8)
        left.set(ylabel="total tokens/s", title="throughput through the stack")
        right.set(ylabel="speculative / plain throughput", title="speedup vs concurrency")
        written.append(_save(fig, out_dir, "speedup_vs_concurrency.png"))
    groups = [(f"{path}\n{variant}", samples) for path, by_variant in results["samples"].items()
              for variant, samples in by_variant.items()]
    if groups:
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(7, len(groups) * 1.1), 7))
        labels = [g[0] for g in groups]
        top.boxplot([[s["ttft_ms"] for s in g[1] if s["ttft_ms"] is not None] or [0] for g in groups],
                    tick_labels=labels)
        bottom.boxplot([[s["token_latency_ms"] for s in g[1] if s["token_latency_ms"] is not None] or [0]
                        for g in groups], tick_labels=labels)
        top.set(ylabel="TTFT (ms, log scale)", yscale="log", title=f"{results['pair']}: latency distributions")
        bottom.set(ylabel="per-token latency (ms)")
        for ax in (top, bottom):
            ax.tick_params(axis="x", labelsize=7)
        written.append(_save(fig, out_dir, "latency.png"))
    return written


def _save(fig, out_dir: Path, name: str) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)
    return name


def write_report(results: dict, out_dir: Path) -> list[Path]:
    """results.json, results.md and the plots into out_dir; the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in PLOTS:
        (out_dir / stale).unlink(missing_ok=True)
    plots = write_plots(results, out_dir)
    (out_dir / RESULTS_JSON).write_text(json.dumps(results, indent=1))
    (out_dir / RESULTS_MD).write_text(render_markdown(results, plots=plots))
    return [out_dir / RESULTS_JSON, out_dir / RESULTS_MD] + [out_dir / p for p in plots]
