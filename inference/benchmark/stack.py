"""The benchmark through the running product: websocket and SSE clients and the sweeps they run.

Both clients time a generation as a user would see it (from sending the request to the first
token and to the last) and take the counts (tokens, steps, accepted draft tokens) from the
serving side, so the same figures as in-process can be compared and the serving overhead is
measured, not assumed. The stack they talk to is the user's (--url) or one
`inference.benchmark.servers.local_stack` starts; `concurrency_sweep` opens N streams at once and
counts the lost and failed ones.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass

import aiohttp

from inference.benchmark.inprocess import PLAIN, Progress, Sample, Variant
from inference.benchmark.prompts import Prompt
from inference.benchmark.servers import Credentials
from inference.benchmark.summary import percentile
from inference.limits import SpeculativeMode
from inference.models import Generation
from inference.serving.rates import LOAD_MEMORY_S
from inference.serving.reasons import Reason

STREAM_TIMEOUT = aiohttp.ClientTimeout(total=600)


class StreamError(Exception):
    """A stream that failed (refused, error event, broken connection) or was lost (ended without
    all its tokens, or its streamed text differs from the final one)."""

    def __init__(self, message: str, *, lost: bool = False):
        super().__init__(message)
        self.lost = lost


# ------------------------------------------------------------------ clients
StreamFn = Callable[..., Coroutine[None, None, Sample]]  # (prompt=, variant=, max_new_tokens=) -> Sample


def _check_complete(*, tokens: int, max_new_tokens: int, streamed: str, final: str | None) -> None:
    if tokens != max_new_tokens:
        raise StreamError(f"ended after {tokens} of {max_new_tokens} tokens", lost=True)
    if final is not None and streamed != final:
        raise StreamError("the streamed text differs from the final text", lost=True)


def websocket_client(*, base_url: str, credentials: Credentials, pair: str) -> StreamFn:
    """The chat's websocket (/ws/chat/), as chat.js uses it: send, then follow the answer's events."""
    url = base_url.replace("http", "ws", 1).rstrip("/") + "/ws/chat/"

    async def stream(*, prompt: Prompt, variant: Variant, max_new_tokens: int) -> Sample:
        cookie = {"Cookie": credentials.session_cookie}
        async with aiohttp.ClientSession(timeout=STREAM_TIMEOUT, headers=cookie) as http:
            try:
                ws = await http.ws_connect(url, origin=base_url)
            except aiohttp.WSServerHandshakeError as exc:
                raise StreamError(f"websocket refused: {exc.status} {exc.message}") from exc
            async with ws:
                started, sent_wall, generation_id = time.perf_counter(), time.time(), ""
                await ws.send_json({"action": "send", "pair": pair, "text": prompt.text,
                                    "settings": variant.request_settings(max_new_tokens)})
                first_at: float | None = None
                pieces: list[str] = []
                async for message in ws:
                    if message.type != aiohttp.WSMsgType.TEXT:
                        break
                    data = json.loads(message.data)
                    if data.get("type") == "error":
                        raise StreamError(f"refused: {data.get('message')}")
                    generation_id = generation_id or data.get("generation") or ""
                    event = data.get("event") or {}
                    if event.get("type") == "delta" and event.get("steps"):
                        first_at = first_at or time.perf_counter()
                        pieces.extend(draft + main for draft, main, *_ in event["steps"])
                    elif event.get("type") == "error":
                        raise StreamError(f"error event: {event.get('message')}")
                    elif event.get("type") == "done":
                        return _stack_sample(prompt=prompt, text="".join(pieces), done=event, started=started,
                                             first_at=first_at, ended=time.perf_counter(),
                                             max_new_tokens=max_new_tokens, final=event.get("text"),
                                             generation_id=generation_id, sent_wall=sent_wall)
                raise StreamError("the websocket closed before the answer was done", lost=True)

    return stream


def sse_client(*, base_url: str, credentials: Credentials, pair: str, extra_body: dict | None = None) -> StreamFn:
    """POST /v1/completions with stream: true (OpenAI's SSE chunks, ending with `data: [DONE]`); `extra_body`
    adds fields another server reads."""
    url = base_url.rstrip("/") + "/v1/completions"

    async def stream(*, prompt: Prompt, variant: Variant, max_new_tokens: int) -> Sample:
        body = {"model": pair, "prompt": prompt.text, "stream": True, "stream_options": {"include_usage": True},
                **variant.request_settings(max_new_tokens), **(extra_body or {})}
        async with aiohttp.ClientSession(timeout=STREAM_TIMEOUT) as http:
            started, sent_wall = time.perf_counter(), time.time()
            async with http.post(url, json=body, headers={"Authorization": f"Bearer {credentials.api_key}"}) as resp:
                if resp.status != 200:
                    raise StreamError(f"HTTP {resp.status}: {(await resp.text())[:300]}")
                first_at, pieces, usage = None, [], None
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        if usage is None:
                            raise StreamError("the stream ended without usage", lost=True)
                        return _stack_sample(prompt=prompt, text="".join(pieces), done=usage, started=started,
                                             first_at=first_at, ended=time.perf_counter(),
                                             max_new_tokens=max_new_tokens, final=None, sent_wall=sent_wall,
                                             generation_id=resp.headers.get("X-Generation-Id", ""))
                    chunk = json.loads(payload)
                    if chunk.get("error"):
                        raise StreamError(f"error chunk: {chunk['error'].get('message')}")
                    for choice in chunk.get("choices") or []:
                        if choice.get("text"):
                            first_at = first_at or time.perf_counter()
                            pieces.append(choice["text"])
                    usage = chunk.get("usage") or usage
                raise StreamError("the stream closed before [DONE]", lost=True)

    return stream


def _stack_sample(*, prompt: Prompt, text: str, done: dict, started: float, first_at: float | None, ended: float,
                  max_new_tokens: int, final: str | None, generation_id: str, sent_wall: float) -> Sample:
    """A Sample from client times and the server's counts (the done event, or the API's usage)."""
    tokens = done.get("completion_tokens") or 0
    _check_complete(tokens=tokens, max_new_tokens=max_new_tokens, streamed=text, final=final)
    first_at = first_at or ended
    return Sample(
        prompt=prompt, text=text, tokens=tokens, started_at=started, duration_s=ended - started,
        ttft_ms=(first_at - started) * 1000,
        token_latency_ms=(ended - first_at) * 1000 / (tokens - 1) if tokens > 1 else None,
        main_steps=done.get("main_steps") or 0, accepted=done.get("accepted_tokens"),
        proposed=done.get("draft_tokens"), generation_id=generation_id, sent_wall=sent_wall,
        path=served_path(done), route=done.get("speculative_route") or "",
    )


def served_path(done: dict) -> str:
    """The path the worker served an answer on, named as the benchmark names its variants ("plain",
    "K=3"), from its usage: what an adaptive request was given, to compare with the fixed lines."""
    mode, k = done.get("speculative_mode"), done.get("speculative_k")
    final = PLAIN.name if mode in (None, SpeculativeMode.OFF) else f"K={k}" if k else str(mode)
    return f"moved to {final}" if Reason.HANDED_OVER in (done.get("speculative_reason_codes") or []) else final


CLIENTS = {"websocket": websocket_client, "sse": sse_client}


@dataclass(frozen=True)
class StackTarget:
    """A running product to measure through: its base URL, a logged-in session and an API key."""

    base_url: str
    credentials: Credentials
    pair: str

    def client(self, name: str) -> StreamFn:
        return CLIENTS[name](base_url=self.base_url, credentials=self.credentials, pair=self.pair)


def ttft_profile(samples_by_path: dict[str, list[dict]]) -> list[dict]:
    """Where the stack's time to first token goes, per path (medians in ms, from the Generation
    rows; client and server clocks must be the same machine's): `web` from sending until the
    generation is recorded (auth, checks, tokenizing), `queue` until a worker claims it (commit,
    Celery), `engine` the first token in the batch, `delivery` the rest (worker setup, the stream's
    flush interval, Redis, the consumer or SSE view, the client)."""
    rows = []
    for path, samples in samples_by_path.items():
        traced = [s for s in samples if s["generation_id"] and s["sent_wall"] is not None and s["ttft_ms"] is not None]
        generations = {str(g.id): g for g in Generation.objects.filter(id__in=[s["generation_id"] for s in traced])}
        parts: dict[str, list[float]] = {"web": [], "queue": [], "engine": [], "delivery": [], "total": []}
        for sample in traced:
            g = generations.get(sample["generation_id"])
            if g is None or g.started_at is None or g.ttft_ms is None:
                continue
            web = (g.created_at.timestamp() - sample["sent_wall"]) * 1000
            queue = (g.started_at - g.created_at).total_seconds() * 1000
            for name, value in (("web", web), ("queue", queue), ("engine", g.ttft_ms),
                                ("delivery", sample["ttft_ms"] - web - queue - g.ttft_ms),
                                ("total", sample["ttft_ms"])):
                parts[name].append(value)
        if parts["total"]:
            rows.append({"path": path, "samples": len(parts["total"]),
                         **{f"{name}_ms_p50": percentile(values, 50) for name, values in parts.items()}})
    return rows


def burst_ttft_profile(records: list[dict], *, client: str) -> list[dict]:
    """The same split for a concurrency sweep's bursts, per level and variant: under load, which part
    of the stack the time to first token grows in."""
    cells: dict[str, list[dict]] = {}
    for record in records:
        cells.setdefault(f"{client}, {record['concurrency']} at once, {record['variant']}", []).extend(
            record["samples"])
    return ttft_profile(cells)


class StackPath:
    """A client as a benchmark path: one generation at a time."""

    def __init__(self, name: str, stream: StreamFn):
        self.name = name
        self.stream = stream

    def run(self, *, prompt: Prompt, variant: Variant, max_new_tokens: int) -> Sample:
        return asyncio.run(self.stream(prompt=prompt, variant=variant, max_new_tokens=max_new_tokens))


# ------------------------------------------------------------------ concurrency
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
