"""Queries: pairs, live workers (from their Redis heartbeats) and each pair's serving state."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings
from django.db.models import Count, Q, Sum

from inference.limits import LoadState, Route, ServingState
from inference.models import Generation, HostCalibration, JobStatus, ModelPair, writing_rate
from inference.serving.processes import process_gone
from inference.transport import WORKER_KEY_PREFIX, held_blocks_key, live_workers

__all__ = ["live_workers"]  # read from the heartbeats in transport.py; queried with the rest from here


@dataclass(frozen=True)
class PairState:
    state: ServingState
    error: str = ""  # what any client may read
    workers: tuple[str, ...] = ()
    detail: str = ""  # a load failure's own words (paths, the library's message): the admin's only

    @property
    def served(self) -> bool:
        return self.state in {ServingState.AVAILABLE, ServingState.LOADING}


def pair_state(*, pair: ModelPair, workers: list[dict]) -> PairState:
    serving = [w for w in workers if pair.queue in w.get("queues", [])]
    if not pair.enabled:
        return PairState(ServingState.UNAVAILABLE, "disabled in the admin")
    if not serving:
        return PairState(ServingState.UNAVAILABLE, f"no live worker serves queue {pair.queue}")
    states = [w.get("pairs", {}).get(pair.slug, {}) for w in serving]
    names = tuple(w["name"] for w in serving)
    if any(s.get("state") == LoadState.AVAILABLE for s in states):
        return PairState(ServingState.AVAILABLE, workers=names)
    failed = [s["error"] for s in states if s.get("state") == LoadState.FAILED]
    if failed and len(failed) == len(states):
        return PairState(ServingState.UNAVAILABLE, "failed to load: an admin can see why on the pair's page",
                         names, detail=f"failed to load: {failed[0]}")
    return PairState(ServingState.LOADING, workers=names)


def pair_states(*, client: redis.Redis) -> dict[str, PairState]:
    workers = live_workers(client=client)
    return {pair.slug: pair_state(pair=pair, workers=workers) for pair in ModelPair.objects.all()}


def enabled_pair(*, slug: str) -> ModelPair | None:
    return ModelPair.objects.filter(slug=slug, enabled=True).first()


def heartbeats_settled(*, client: redis.Redis) -> bool:
    """False for a heartbeat TTL after Redis (re)started: a Redis without persistence forgot every
    heartbeat, and a worker missing from it then is not known to be dead."""
    return redis_up_for(client=client, seconds=settings.WORKER_HEARTBEAT_TTL_S)


def redis_up_for(*, client: redis.Redis, seconds: float) -> bool:
    """Redis has run `seconds` since it (re)started: what its processes write every so often is back."""
    info: Any = client.info("server")
    return int(info["uptime_in_seconds"]) >= seconds


def worker_is_alive(*, client: redis.Redis, name: str) -> bool:
    """Its heartbeat has not expired, and its process is not known to be gone (killed: serving/processes.py)."""
    beat: Any = client.get(WORKER_KEY_PREFIX + name)
    return bool(beat) and not process_gone(json.loads(beat).get("process"))


def generation_for_user(*, generation_id, user) -> Generation | None:
    return Generation.objects.filter(id=generation_id, user=user).select_related("pair").first()


def answers_served_lately(*, pair: ModelPair, last: int = 50) -> list[dict]:
    """The pair's last finished answers by how they were served (route and K): how many, and their median tokens/s
    after the first token, what the admin shows once answers are served (the workers' own step figures time the
    library's pipelines only)."""
    by_way: dict[tuple[str, int | None], list[float]] = {}
    for route, k, rate in _rates_lately(Generation.objects.filter(pair=pair), "speculative_route", "speculative_k",
                                        last=last):
        by_way.setdefault((route or "unknown", k), []).append(rate)
    return [{"route": route, "k": k, "answers": len(rates), "median_tokens_per_s": statistics.median(rates)}
            for (route, k), rates in sorted(by_way.items(), key=lambda item: -len(item[1]))]


def median_rate_lately(*, pair: ModelPair, main_alone: bool, last: int = 20) -> float:
    """The median tokens/s after the first token of the pair's last answers of at least 16 tokens written by the main
    alone (or with speculation), 0 without any. The main alone's is part of the baseline every speed-up is weighed
    against (serving/calibrated.py): a calibration timed while the host was busy understates the main alone, and an
    answer would be said faster than it was (docs/calibration.md#what-it-changes)."""
    routes = [route for route in Route if route.is_main_alone() == main_alone]
    rates = [rate for (rate,) in _rates_lately(Generation.objects.filter(
        pair=pair, completion_tokens__gte=16, speculative_route__in=routes), last=last)]
    return statistics.median(rates) if rates else 0.0


def answers_in_flight(*, pair: ModelPair, worker: str) -> tuple[int, int]:
    """(the pair's answers queued or running anywhere, the chats' titles `worker` is writing). A title, 12 tokens at
    most written after a chat's first answer, is no load to plan an answer for: the next turn, often sent while it is
    written, would otherwise start in the own engine's batch, not speculating."""
    counts = Generation.objects.filter(pair=pair, status__in=[Generation.Status.QUEUED, Generation.Status.RUNNING]
                                       ).aggregate(
        answers=Count("id", filter=~Q(source=Generation.Source.TITLE)),
        titles=Count("id", filter=Q(source=Generation.Source.TITLE, status=Generation.Status.RUNNING, worker=worker)))
    return counts["answers"], counts["titles"]


def _rates_lately(answers, *fields: str, last: int):
    """`fields` and the tokens/s after the first token of the newest `last` finished answers that have one (a chat's
    title, a few tokens the model writes after its first answer, is no answer a speed is judged on)."""
    rows = (answers.filter(status=Generation.Status.FINISHED, ttft_ms__isnull=False, duration_ms__isnull=False)
            .exclude(source=Generation.Source.TITLE)
            .order_by("-finished_at").values_list(*fields, "completion_tokens", "duration_ms", "ttft_ms")[:last])
    for *values, tokens, duration, first in rows:
        if (rate := writing_rate(tokens=tokens, duration_ms=duration, ttft_ms=first)) is not None:
            yield (*values, rate)


@dataclass(frozen=True)
class PairWorker:
    """A live worker of a pair as the admin shows it: what it runs and what its cache holds for the pair."""

    name: str
    state: str
    running: int  # the pair's answers running there
    routed: int  # the pair's answers routed to it and not ended (queued or running)
    cached_tokens: int  # the tokens of the blocks its main holds for the pair, findable by the next turns
    cache_share: float | None  # of the prompt tokens of the answers it served in the last day, those read from cache


IN_FLIGHT = (Generation.Status.QUEUED, Generation.Status.RUNNING)


def routed_in_flight(*, pair: ModelPair) -> dict[str, int]:
    """Worker -> the pair's answers routed to it and not ended (serving/routing.py balances by it)."""
    rows = (Generation.objects.filter(pair=pair, status__in=IN_FLIGHT).exclude(routed_to="")
            .values("routed_to").annotate(n=Count("id")))
    return {row["routed_to"]: row["n"] for row in rows}


def pair_workers(*, pair: ModelPair, client: redis.Redis, since) -> list[PairWorker]:
    serving = [beat for beat in live_workers(client=client) if pair.queue in beat.get("queues", ())]
    pipe = client.pipeline(transaction=False)
    for beat in serving:
        pipe.scard(held_blocks_key(worker=beat["name"], slug=pair.slug))
    held = pipe.execute()
    in_flight = routed_in_flight(pair=pair)
    served = {worker: (prompt, cached) for worker, prompt, cached in
              Generation.objects.filter(pair=pair, finished_at__gte=since).values("worker")
              .annotate(prompt=Sum("prompt_tokens"), cached=Sum("cached_tokens"))
              .values_list("worker", "prompt", "cached")}
    rows = []
    for beat, blocks in zip(serving, held, strict=True):
        name = beat["name"]
        prompt, cached = served.get(name, (0, 0))
        state = "stopping" if beat.get("stopping") else beat.get("pairs", {}).get(pair.slug, {}).get("state", "-")
        rows.append(PairWorker(
            name=name, state=state, running=beat.get("active", 0), routed=in_flight.get(name, 0),
            cached_tokens=blocks * (beat.get("kv_block_tokens", {}).get(pair.slug) or 0),
            cache_share=cached / prompt if prompt else None))
    return rows


def finished_calibration(*, pair: ModelPair, host: str) -> HostCalibration | None:
    """The pair's latest finished calibration on the host with this signature."""
    return (HostCalibration.objects.filter(pair=pair, host=host, status=JobStatus.FINISHED)
            .order_by("-finished_at").first())


def pair_calibrations(*, pair: ModelPair) -> list[HostCalibration]:
    """The pair's latest calibration per host, newest first (what the admin and /v1/config show)."""
    latest: dict[str, HostCalibration] = {}
    for calibration in pair.calibrations.order_by("-created_at"):
        latest.setdefault(calibration.host, calibration)
    return list(latest.values())
