"""The benchmark's loads through the running product, on one of stack.py's clients: `concurrency_sweep` opens
N streams at once (bursts) and counts the lost and failed ones, `steady_sweep` keeps N clients asking (a team's
load); `summarize_concurrency` makes the bursts' rows, `burst_ttft_profile` where their time to first token goes.
"""

import asyncio
import random
import statistics
import sys
import time
from collections import Counter

from inference.benchmark.inprocess import Progress, Sample, Variant
from inference.benchmark.prompts import Prompt
from inference.benchmark.stack import StreamError, StreamFn, ttft_profile
from inference.benchmark.summary import percentile
from inference.serving.rates import LOAD_MEMORY_S


def burst_ttft_profile(records: list[dict], *, client: str) -> list[dict]:
    """The same split for a concurrency sweep's bursts, per level and variant: under load, which part
    of the stack the time to first token grows in."""
    cells: dict[str, list[dict]] = {}
    for record in records:
        cells.setdefault(f"{client}, {record['concurrency']} at once, {record['variant']}", []).extend(
            record["samples"])
    return ttft_profile(cells)


def concurrency_sweep(
    *, stream: StreamFn, prompts: list[Prompt], levels: list[int], variants: list[Variant], max_new_tokens: int,
    repeats: int, progress: Progress | None = None,
) -> list[dict]:
    """Bursts of N simultaneous streams, interleaved repeat -> level -> variant, the variants' order turned
    by one each repeat (the host's speed drifts within a minute here: a line always run last would carry
    it) and reversed every other one (turned alone, a line always follows the same one, and carries what that one
    leaves on the host: an idle worker after the peer's burst, say); one record per burst. Each variant first runs
    once unrecorded: a worker loads an engine on its first use (the main alone, the own engine), and that load must
    not count as the first level's."""
    records, total = [], repeats * len(levels) * len(variants)
    for variant in variants:
        asyncio.run(_burst(stream=stream, prompts=prompts[:1], level=1, variant=variant,
                           max_new_tokens=min(8, max_new_tokens)))
    previous = sys.maxsize
    for repeat in range(repeats):
        for level in levels:
            previous = _load_memory_faded(previous=previous, level=level)
            for variant in _turned(variants, repeat=repeat):
                record = asyncio.run(_burst(stream=stream, prompts=prompts, level=level, variant=variant,
                                            max_new_tokens=max_new_tokens))
                records.append({**record, "repeat": repeat})
                if progress:
                    progress(len(records), total, f"{level} streams {variant.name} repeat {repeat + 1}/{repeats}")
    return records


def _turned(variants: list[Variant], *, repeat: int) -> list[Variant]:
    turn = repeat % len(variants)
    order = variants[turn:] + variants[:turn]
    return order[::-1] if repeat % 2 else order


def _load_memory_faded(*, previous: int, level: int) -> int:
    """Waits, before a smaller load than the last, until the worker no longer plans for the last: its
    requests plan for the most streams it ran in the last LOAD_MEMORY_S (serving/rates.py), and a
    1-stream burst run 3 s after one of 16 was planned for 4+ streams. Returns the load now measured."""
    if level < previous:
        time.sleep(LOAD_MEMORY_S)
    return level


async def _burst(*, stream: StreamFn, prompts: list[Prompt], level: int, variant: Variant,
                 max_new_tokens: int) -> dict:
    """`level` streams at once; fewer streams than prompts go on, `level` at a time, until each prompt was asked
    once: a level's figure is over the same requests as the others' (a draft's speed depends on the prompt, so
    one prompt alone is no lone answer's speed)."""
    wall, outcomes = 0.0, []
    for first in range(0, max(level, len(prompts)), level):
        started = time.perf_counter()
        outcomes += await asyncio.gather(
            *(stream(prompt=prompts[i % len(prompts)], variant=variant, max_new_tokens=max_new_tokens)
              for i in range(first, first + level)), return_exceptions=True)
        wall += time.perf_counter() - started
    samples = [o for o in outcomes if isinstance(o, Sample)]
    problems = [o for o in outcomes if not isinstance(o, Sample)]
    lost = [p for p in problems if isinstance(p, StreamError) and p.lost]
    return {
        "variant": variant.name,
        "concurrency": level,
        "wall_s": wall,
        "tokens": sum(s.tokens for s in samples),
        "throughput": sum(s.tokens for s in samples) / wall,
        "completed": len(samples),
        "lost": len(lost),
        "failed": len(problems) - len(lost),
        "errors": sorted({f"{type(p).__name__}: {p}" for p in problems})[:5],
        "samples": [s.as_dict() for s in samples],
    }


def steady_sweep(*, stream: StreamFn, prompts: list[Prompt], levels: list[int], variants: list[Variant],
                 max_new_tokens: int, rounds: int, repeats: int = 1, progress: Progress | None = None) -> list[dict]:
    """N clients that each ask again as soon as their answer ends, their first requests spread over one
    lone answer's time: a team's load, where a request arrives while the others run. (A burst, above,
    is the worst case for time to first token: N prefills at once.) Answers are 0.5-1.5x `max_new_tokens`
    long, the same lengths for every variant: answers of one length, run at one speed, end together and
    send their next requests in clumps (a burst each time). Counted: the requests sent while every client
    was in its loop, not the ramp up or down; throughput from them by Little's law. One window per
    repeat, interleaved and turned as concurrency_sweep's bursts are."""
    windows: dict[tuple[str, int], list[dict]] = {}
    total, done, previous = repeats * len(levels) * len(variants), 0, sys.maxsize
    for repeat in range(repeats):
        for position, level in enumerate(levels):
            previous = _load_memory_faded(previous=previous, level=level)
            turn = (repeat + position) % len(variants)
            for variant in variants[turn:] + variants[:turn]:
                windows.setdefault((variant.name, level), []).append(asyncio.run(_steady(
                    stream=stream, prompts=prompts, level=level, variant=variant, max_new_tokens=max_new_tokens,
                    rounds=rounds)))
                done += 1
                if progress:
                    progress(done, total, f"steady {level} streams {variant.name} repeat {repeat + 1}/{repeats}")
    rows = [_steady_row(variant=variant.name, level=level, windows=windows[(variant.name, level)])
            for level in levels for variant in variants]
    ttft_at_one = {r["variant"]: r["ttft_ms_p50"] for r in rows if r["concurrency"] == 1}
    for row in rows:
        one = ttft_at_one.get(row["variant"])
        row["ttft_vs_one"] = row["ttft_ms_p50"] / one if one and row["ttft_ms_p50"] is not None else None
    return rows


async def _steady(*, stream: StreamFn, prompts: list[Prompt], level: int, variant: Variant, max_new_tokens: int,
                  rounds: int) -> dict:
    """One window: {"counted": the samples counted, "throughput": tok/s, "failed": error texts}."""
    lone = await stream(prompt=prompts[0], variant=variant, max_new_tokens=max_new_tokens)
    spacing = lone.duration_s / level

    failed: list[str] = []

    async def client(index: int) -> list[Sample]:
        lengths = random.Random(index)  # the same spread of lengths for every variant
        await asyncio.sleep(index * spacing)
        answered = []
        for turn in range(rounds):
            try:
                answered.append(await stream(prompt=prompts[(index + turn * level) % len(prompts)], variant=variant,
                                             max_new_tokens=lengths.randint(max_new_tokens // 2,
                                                                            max(max_new_tokens * 3 // 2, 1))))
            except Exception as exc:  # counted, as a burst counts it; the other clients go on
                failed.append(f"{type(exc).__name__}: {exc}")
        return answered

    answers = [a for a in await asyncio.gather(*(client(i) for i in range(level))) if a]
    all_in = max((a[0].started_at for a in answers), default=0.0)  # the last client's first request
    first_out = min((a[-1].started_at + a[-1].duration_s for a in answers), default=0.0)  # the first one done
    counted = [s for a in answers for s in a if all_in <= s.started_at <= first_out]
    # Little's law for N clients that ask again at once: N answers in flight, each taking its duration
    throughput = level * sum(s.tokens for s in counted) / sum(s.duration_s for s in counted) if counted else 0.0
    return {"counted": counted, "throughput": throughput, "failed": failed}


def _steady_row(*, variant: str, level: int, windows: list[dict]) -> dict:
    counted = [s for window in windows for s in window["counted"]]
    failed = [error for window in windows for error in window["failed"]]
    return {"variant": variant, "concurrency": level, "requests": len(counted),
            "throughput": statistics.median(w["throughput"] for w in windows),
            "throughput_by_repeat": [w["throughput"] for w in windows],
            "paths": dict(Counter(s.path for s in counted).most_common()),
            "ttft_ms_p50": percentile([s.ttft_ms for s in counted], 50),
            "ttft_ms_p95": percentile([s.ttft_ms for s in counted], 95),
            "stream_tokens_per_s_p50": percentile([s.tokens_per_s for s in counted], 50),
            "failed": len(failed), "errors": sorted(set(failed))[:5]}


def summarize_concurrency(records: list[dict]) -> list[dict]:
    """Per variant and level: throughput (median and spread over bursts, and per repeat for paired
    comparisons), its scaling over one stream, speculative over plain at the same level, latencies,
    the paths the answers were served on, and lost/failed streams."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for record in records:
        groups.setdefault((record["variant"], record["concurrency"]), []).append(record)
    rows = []
    for (variant, level), bursts in groups.items():
        samples = [s for b in bursts for s in b["samples"]]
        rows.append({
            "variant": variant,
            "concurrency": level,
            "bursts": len(bursts),
            "streams": level * len(bursts),
            "throughput": statistics.median(b["throughput"] for b in bursts),
            "throughput_spread": [min(b["throughput"] for b in bursts), max(b["throughput"] for b in bursts)],
            "throughput_by_repeat": [b["throughput"] for b in sorted(bursts, key=lambda b: b.get("repeat", 0))],
            "paths": dict(Counter(s.get("path", "") for s in samples).most_common()),
            "stream_tokens_per_s_p50": percentile([s["tokens_per_s"] for s in samples], 50),
            "ttft_ms_p50": percentile([s["ttft_ms"] for s in samples], 50),
            "ttft_ms_p95": percentile([s["ttft_ms"] for s in samples], 95),
            "token_latency_ms_p50": percentile([s["token_latency_ms"] for s in samples], 50),
            "token_latency_ms_p95": percentile([s["token_latency_ms"] for s in samples], 95),
            "lost": sum(b["lost"] for b in bursts),
            "failed": sum(b["failed"] for b in bursts),
            "errors": sorted({e for b in bursts for e in b["errors"]})[:5],
        })
    by_key = {(r["variant"], r["concurrency"]): r for r in rows}
    for row in rows:
        one = by_key.get((row["variant"], 1))
        plain = by_key.get(("plain", row["concurrency"]))
        row["scaling"] = row["throughput"] / one["throughput"] if one and one["throughput"] else None
        row["speedup"] = row["throughput"] / plain["throughput"] if plain and plain["throughput"] else None
    return rows
