"""The benchmark through the running product: websocket and SSE clients and the sweeps they run.

Both clients time a generation as a user would see it (from sending the request to the first
token and to the last) and take the counts (tokens, steps, accepted draft tokens) from the
serving side, so the same figures as in-process can be compared and the serving overhead is
measured, not assumed. The stack they talk to is the user's (--url) or one
`inference.benchmark.servers.local_stack` starts; the sweeps that open N streams at once are in sweeps.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass

import aiohttp

from inference.benchmark.inprocess import PLAIN, Sample, Variant
from inference.benchmark.prompts import Prompt
from inference.benchmark.servers import Credentials
from inference.benchmark.summary import percentile
from inference.limits import SpeculativeMode
from inference.models import Generation
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


class StackPath:
    """A client as a benchmark path: one generation at a time."""

    def __init__(self, name: str, stream: StreamFn):
        self.name = name
        self.stream = stream

    def run(self, *, prompt: Prompt, variant: Variant, max_new_tokens: int) -> Sample:
        return asyncio.run(self.stream(prompt=prompt, variant=variant, max_new_tokens=max_new_tokens))
