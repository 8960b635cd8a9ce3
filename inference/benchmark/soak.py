"""The soak: many mixed generations through a private stack while it is hurt, then proof that nothing
hung, nothing was lost and nothing leaked.

The stack is `inference.benchmark.servers.private_stack`: its own Redis, two Celery workers on the
pair's queue and daphne. `run_soak` sends generations of four kinds (the chat's websocket, SSE,
non-streaming, background + resume) with random disconnects, reconnects and stops, phase by phase at
each concurrency, kills a worker and restarts Redis on the way, and `check` reads what is left: every
generation ended, every streamed text equals the stored one, no 500, no phantom in-flight slot, memory
of the surviving worker and of Redis back to where it was.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp
from django.db.models import Q

from inference import transport
from inference.benchmark.prompts import heldout_prompts
from inference.benchmark.servers import BENCHMARK_USERNAME, Credentials, PrivateStack, StackError
from inference.models import Generation, ModelPair
from inference.serving import web

KINDS = ("websocket", "sse", "blocking", "background")
TIMEOUT = aiohttp.ClientTimeout(total=300, sock_read=120)


@dataclass(frozen=True)
class SoakOptions:
    generations: int = 1000
    concurrency: tuple[int, ...] = (4, 8, 16)
    max_tokens: tuple[int, int] = (8, 40)  # each request asks for a random count in this range
    seed: int = 0
    kill_worker: bool = True  # SIGKILL one of the two workers a third of the way, then start it again
    restart_redis: bool = True  # restart Redis two thirds of the way
    freeze_steps_s: float = 60  # SIGSTOP the step processes of one worker a fifth of the way for this long (0: no)
    worker_threads: int = 8
    stream_ttl_s: int = 15  # streams expire this long after their answer: Redis memory is read after that


# ------------------------------------------------------------------ one generation, as a client sees it
@dataclass
class Outcome:
    kind: str
    behaviour: str
    generation_id: str = ""
    text: str = ""
    ended: str = ""  # done, error, left (the client went away on purpose), broken (closed without an end)
    http_status: int = 200
    error: str = ""
    last_event_at: float = field(default_factory=time.monotonic)  # the request's start, then each event's arrival
    previous_event_at: float = field(default_factory=time.monotonic)  # the event before the last one
    ended_at: float = 0.0
    surfaced_s: float | None = None  # for a failure: how long its client waited for the error since the last event

    def seen(self) -> None:
        self.previous_event_at, self.last_event_at = self.last_event_at, time.monotonic()

    def end(self, how: str, error: str = "") -> Outcome:
        self.ended, self.error, self.ended_at = how, error, time.monotonic()
        if how in {"error", "broken"}:
            self.surfaced_s = self.ended_at - self.previous_event_at
        return self


class SoakClient:
    def __init__(self, *, base_url: str, credentials: Credentials, pair: str):
        self.base_url = base_url.rstrip("/")
        self.credentials = credentials
        self.pair = pair
        self.auth = {"Authorization": f"Bearer {credentials.api_key}"}

    async def run(self, *, kind: str, behaviour: str, prompt: str, max_tokens: int) -> Outcome:
        outcome = Outcome(kind=kind, behaviour=behaviour)
        try:
            async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
                if kind == "websocket":
                    return await self._websocket(http, outcome, prompt, max_tokens)
                if kind == "blocking":
                    return await self._blocking(http, outcome, prompt, max_tokens)
                return await self._sse(http, outcome, prompt, max_tokens)
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
            return outcome.end("broken", f"{type(exc).__name__}: {exc}")

    async def _blocking(self, http, outcome: Outcome, prompt: str, max_tokens: int) -> Outcome:
        body = {"model": self.pair, "prompt": prompt, "max_tokens": max_tokens}
        async with http.post(f"{self.base_url}/v1/completions", json=body, headers=self.auth) as resp:
            outcome.http_status, outcome.generation_id = resp.status, resp.headers.get("X-Generation-Id", "")
            data = await resp.json(content_type=None)
        outcome.seen()
        if resp.status != 200:
            return outcome.end("error", (data.get("error") or {}).get("message", str(data)))
        outcome.text = data["choices"][0]["text"]
        return outcome.end("done")

    async def _sse(self, http, outcome: Outcome, prompt: str, max_tokens: int) -> Outcome:
        """SSE: `background` leaves after the first chunk and resumes with Last-Event-ID; `leave`
        goes away for good (its answer is stopped); `cancel` asks the API to stop it."""
        background = outcome.kind == "background"
        body = {"model": self.pair, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                "background": background}
        async with http.post(f"{self.base_url}/v1/completions", json=body, headers=self.auth) as resp:
            outcome.http_status, outcome.generation_id = resp.status, resp.headers.get("X-Generation-Id", "")
            if resp.status != 200:
                return outcome.end("error", (await resp.text())[:300])
            last_id, ended = await self._read_sse(resp, outcome,
                                                  stop_after_first=background or outcome.behaviour != "plain")
        if ended:
            return outcome
        if outcome.behaviour == "leave":
            return outcome.end("left")
        if outcome.behaviour == "cancel":
            async with http.post(f"{self.base_url}/v1/completions/{outcome.generation_id}/cancel",
                                 headers=self.auth) as resp:
                outcome.http_status = resp.status
        await asyncio.sleep(random.uniform(0, 1))
        headers = {**self.auth, "Last-Event-ID": last_id} if last_id else self.auth
        async with http.get(f"{self.base_url}/v1/completions/{outcome.generation_id}/events",
                            headers=headers) as resp:
            outcome.http_status = resp.status
            if resp.status != 200:
                return outcome.end("error", (await resp.text())[:300])
            _, ended = await self._read_sse(resp, outcome, stop_after_first=False)
        return outcome if ended else outcome.end("broken", "the resumed stream closed before [DONE]")

    @staticmethod
    async def _read_sse(resp, outcome: Outcome, *, stop_after_first: bool) -> tuple[str, bool]:
        last_id = ""
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("id:"):
                last_id = line[3:].strip()
            if not line.startswith("data:"):
                continue
            outcome.seen()
            payload = line[5:].strip()
            if payload == "[DONE]":
                if not outcome.ended:
                    outcome.end("done")
                return last_id, True
            chunk = json.loads(payload)
            if chunk.get("error"):
                outcome.end("error", chunk["error"].get("message", ""))
                continue
            outcome.text += "".join(choice.get("text") or "" for choice in chunk.get("choices") or [])
            if stop_after_first and outcome.text and last_id:
                return last_id, False
        if outcome.ended:
            return last_id, True
        return last_id, bool(outcome.end("broken", "the stream closed before [DONE]"))

    async def _websocket(self, http, outcome: Outcome, prompt: str, max_tokens: int) -> Outcome:
        """The chat: `reconnect` drops the socket after the first delta and follows again from its
        last event; `stop` asks for a stop after the first delta."""
        url = self.base_url.replace("http", "ws", 1) + "/ws/chat/"
        headers = {"Cookie": self.credentials.session_cookie}
        state = {"after": "0-0", "steps": 0}
        message: dict[str, object] = {"action": "send", "pair": self.pair, "text": prompt,
                                      "settings": {"max_tokens": max_tokens}}
        for attempt in range(2):
            async with http.ws_connect(url, origin=self.base_url, headers=headers) as ws:
                await ws.send_json(message)
                left = await self._read_socket(ws, outcome, state, drop_after_first=attempt == 0 and
                                               outcome.behaviour == "reconnect")
            if outcome.ended or not left:
                return outcome if outcome.ended else outcome.end("broken", "the socket closed without an end")
            message = {"action": "follow", "generation": outcome.generation_id, "after": state["after"],
                       "steps": state["steps"]}
        return outcome

    async def _read_socket(self, ws, outcome: Outcome, state: dict, *, drop_after_first: bool) -> bool:
        """True if it left on purpose (to reconnect)."""
        async for raw in ws:
            if raw.type != aiohttp.WSMsgType.TEXT:
                return False
            data = json.loads(raw.data)
            outcome.seen()
            if data.get("type") == "error":
                if data.get("code") == "internal_error":
                    outcome.http_status = 500  # what the API would have answered
                outcome.end("error", data.get("message", ""))
                return False
            outcome.generation_id = outcome.generation_id or data.get("generation") or ""
            event = data.get("event") or {}
            if data.get("id"):
                state["after"] = data["id"]
            if event.get("type") == "delta":
                state["steps"] += len(event["steps"])
                outcome.text += "".join(draft + main for draft, main, *_ in event["steps"])
                if drop_after_first:
                    return True
                if outcome.behaviour == "stop" and not state.get("stopped"):
                    state["stopped"] = True
                    await ws.send_json({"action": "stop", "generation": outcome.generation_id})
            elif event.get("type") == "done":
                outcome.end("done")
                return False
            elif event.get("type") == "error":
                outcome.end("error", event.get("message", ""))
                return False
        return False


BEHAVIOURS = {"websocket": (("plain", 6), ("reconnect", 3), ("stop", 1)),
              "sse": (("plain", 7), ("leave", 1), ("cancel", 2)),
              "blocking": (("plain", 1),),
              "background": (("plain", 1),)}
KIND_WEIGHTS = {"websocket": 4, "sse": 3, "blocking": 1, "background": 2}


def plan_requests(*, options: SoakOptions) -> list[dict]:
    """The whole run, drawn from the seed: kind, behaviour, prompt and length of each generation."""
    rng = random.Random(options.seed)
    prompts = [p.text for p in heldout_prompts()]
    plan = []
    for _ in range(options.generations):
        kind = rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
        names, weights = zip(*BEHAVIOURS[kind], strict=True)
        plan.append({"kind": kind, "behaviour": rng.choices(names, weights=weights)[0],
                     "prompt": rng.choice(prompts), "max_tokens": rng.randint(*options.max_tokens)})
    return plan


# ------------------------------------------------------------------ the run
async def _phase(*, client: SoakClient, requests: list[dict], concurrency: int, done: list[Outcome],
                 progress) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(request: dict) -> None:
        async with gate:
            done.append(await client.run(**request))
            progress(len(done))

    await asyncio.gather(*(one(r) for r in requests))


def run_soak(*, stack: PrivateStack, credentials: Credentials, options: SoakOptions,
             progress: Callable[[int], None] = lambda n: None) -> dict:
    """Run the plan phase by phase (one per concurrency), with the faults on the way;
    then wait for the stack to settle and return the figures `check` judges."""
    plan = plan_requests(options=options)
    client = SoakClient(base_url=stack.base_url, credentials=credentials, pair=stack.pair.slug)
    started_wall = time.time()
    top = max(options.concurrency)
    warm: list[Outcome] = []  # a burst at the top level first: the engines' caches grow to their working size
    asyncio.run(_phase(client=client, concurrency=top, done=warm, progress=lambda n: None,
                       requests=[{**r, "kind": "sse", "behaviour": "plain"} for r in plan[:2 * top]]))
    if any(o.ended != "done" for o in warm):
        raise StackError(f"the stack does not answer: {next(o.error for o in warm if o.ended != 'done')}")
    measured_pid, worker_mb = stack.pss_mb(1)  # the worker the soak does not kill
    baseline = {"worker_pss_mb": worker_mb, "redis_used_mb": _redis_mb(stack)}
    outcomes: list[Outcome] = []
    faults: list[dict] = []
    # Mid-phase (not between phases, when nothing runs): answers are being written when it happens.
    triggers = {int(len(plan) * 0.2): "freeze_steps" if options.freeze_steps_s else None,
                int(len(plan) * 0.45): "kill_worker" if options.kill_worker else None,
                int(len(plan) * 0.8): "restart_redis" if options.restart_redis else None}
    pss_by_phase: list[float] = []

    def on_progress(count: int) -> None:
        fault = triggers.pop(count, None)
        if fault:
            faults.append({"fault": fault, "at": time.monotonic(), "after_generations": count})
            asyncio.get_running_loop().run_in_executor(None, _inject, stack, fault, options)
        progress(count)

    async def run_all() -> None:
        chunks = _split(plan, len(options.concurrency))
        for level, chunk in zip(options.concurrency, chunks, strict=True):
            await _phase(client=client, requests=chunk, concurrency=level, done=outcomes, progress=on_progress)
            pss_by_phase.append(stack.pss_mb(1)[1])

    began = time.monotonic()
    asyncio.run(run_all())
    elapsed = time.monotonic() - began
    settled = _wait_settled(stack=stack, since_wall=started_wall, timeout=60 + options.stream_ttl_s)
    figures = check(outcomes=outcomes, stack=stack, since_wall=started_wall, credentials=credentials)
    end_pid, worker_mb = stack.pss_mb(1)
    end = {"worker_pss_mb": worker_mb, "redis_used_mb": _redis_mb(stack)}
    memory = {**{f"baseline_{k}": v for k, v in baseline.items()}, **{f"end_{k}": v for k, v in end.items()},
              "worker_pss_mb_after_each_phase": pss_by_phase, "same_worker": end_pid == measured_pid,
              "worker_growth_mb": end["worker_pss_mb"] - baseline["worker_pss_mb"],
              "redis_growth_mb": end["redis_used_mb"] - baseline["redis_used_mb"]}
    figures.update(elapsed_s=elapsed, unplanned_worker_exits=stack.unplanned_exits, settled=settled, memory=memory,
                   faults=[{k: v for k, v in f.items() if k != "at"} for f in faults])
    return figures


def _split(items: list, parts: int) -> list[list]:
    size = -(-len(items) // parts)
    return [items[i * size:(i + 1) * size] for i in range(parts)]


def _inject(stack: PrivateStack, fault: str, options: SoakOptions) -> None:
    if fault == "freeze_steps":  # hung but alive, as a stuck kernel or a swapped-out machine leaves them
        stack.freeze_steps(0, seconds=options.freeze_steps_s)
    elif fault == "kill_worker":
        stack.kill_worker(0)
        time.sleep(2)
        stack.restart_killed_worker(0)
    else:
        stack.redis.restart()


def _redis_mb(stack: PrivateStack) -> float:
    info = stack.redis.client().info("memory")
    assert isinstance(info, dict)  # a synchronous client's answer
    return int(info["used_memory"]) / 2**20


def _wait_settled(*, stack: PrivateStack, since_wall: float, timeout: float) -> bool:
    """Until every soak generation has ended and every stream has expired."""
    client = stack.redis.client()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        open_rows = _soak_rows(stack.pair, since_wall).filter(status__in=web.IN_FLIGHT).exists()
        if not open_rows and not any(True for _ in client.scan_iter(transport.stream_key("*"), count=1000)):
            return True
        time.sleep(1)
    return False




def _soak_rows(pair: ModelPair, since_wall: float):
    return Generation.objects.filter(pair=pair, created_at__gte=datetime.fromtimestamp(since_wall, UTC))


def check(*, outcomes: list[Outcome], stack: PrivateStack, since_wall: float, credentials: Credentials) -> dict:
    """The figures of the bars, from what the clients saw and what the database holds."""
    rows = {str(g.id): g for g in _soak_rows(stack.pair, since_wall)}
    stuck = [gid for gid, g in rows.items() if not g.is_done]
    compared = mismatched = 0
    mismatches = []
    for outcome in outcomes:
        row = rows.get(outcome.generation_id)
        if outcome.ended != "done" or row is None or row.status == Generation.Status.FAILED:
            continue
        compared += 1
        if outcome.text != row.text:
            mismatched += 1
            mismatches.append({"generation": outcome.generation_id, "kind": outcome.kind,
                               "behaviour": outcome.behaviour, "streamed": len(outcome.text),
                               "stored": len(row.text)})
    failed = [o for o in outcomes if o.ended in {"error", "broken"}]
    surfaced = [o.surfaced_s for o in failed if o.surfaced_s is not None]
    # A key's and a chat user's slots are counted from their records in flight: what is left there
    # after the soak would refuse requests that should pass.
    phantom = Generation.objects.filter(Q(api_key__user__username=BENCHMARK_USERNAME) |
                                        Q(user__username=BENCHMARK_USERNAME), status__in=web.IN_FLIGHT).count()
    return {
        "generations": len(outcomes),
        "by_kind": dict(Counter(f"{o.kind}/{o.behaviour}" for o in outcomes)),
        "ended": dict(Counter(o.ended for o in outcomes)),
        "stored_status": dict(Counter(g.status for g in rows.values())),
        "stuck": len(stuck),
        "compared_texts": compared,
        "mismatched_texts": mismatched,
        "mismatches": mismatches[:10],
        "server_errors": sum(o.http_status >= 500 and o.http_status != 503 for o in outcomes),
        "unavailable_503": sum(o.http_status == 503 for o in outcomes),
        "broken": sum(o.ended == "broken" for o in outcomes),
        "failure_surfaced_max_s": max(surfaced, default=0.0),
        "errors": dict(Counter(o.error[:80] for o in failed).most_common(8)),
        "phantom_in_flight": phantom,
    }


def verdicts(figures: dict) -> list[tuple[str, bool, str]]:
    """(bar, met, measured) for the soak's bars."""
    memory = figures["memory"]
    return [
        ("0 stuck", figures["stuck"] == 0 and figures["settled"], f"{figures['stuck']} stuck"),
        ("0 lost or doubled tokens", figures["mismatched_texts"] == 0,
         f"{figures['mismatched_texts']} of {figures['compared_texts']} streamed texts differ from the stored ones"),
        ("0 server errors (500)", figures["server_errors"] == 0, f"{figures['server_errors']}"),
        ("0 streams closed without an end", figures["broken"] == 0, f"{figures['broken']}"),
        ("failures surfaced within 15 s", figures["failure_surfaced_max_s"] <= 15,
         f"max {figures['failure_surfaced_max_s']:.1f} s"),
        ("0 phantom in-flight slots", figures["phantom_in_flight"] == 0, f"{figures['phantom_in_flight']}"),
        ("worker memory back to baseline (+10% or +64 MB)", memory["same_worker"] and
         memory["worker_growth_mb"] <= max(64, 0.1 * memory["baseline_worker_pss_mb"]),
         f"{memory['baseline_worker_pss_mb']:.0f} -> {memory['end_worker_pss_mb']:.0f} MB"),
        ("Redis memory back to baseline (+2 MB)", memory["redis_growth_mb"] <= 2,
         f"{memory['baseline_redis_used_mb']:.1f} -> {memory['end_redis_used_mb']:.1f} MB"),
    ]
