"""Which worker a turn goes to: the one that holds its prompt's KV blocks, unless that one is too busy.

A follow-up is fast only where the previous turn's keys and values are still cached. With several workers of a pair,
each publishes which of the main's blocks its pool holds: the hashes the own engine keys its blocks by
(engines/own/block_pool.py `block_hashes`, chained and scoped by user), as a Redis set that expires with the worker.
The web side hashes the prompt the same way, counts for each live worker of the pair the leading blocks it holds and
sends the task to the best one's own queue (`pair.<slug>.<worker>`, consumed beside the shared `pair.<slug>`). It
goes by load instead, to the worker with the fewest answers in flight, when the holder has more than
ROUTE_LOAD_MARGIN answers in flight above that one, as SGLang's router balances once loads drift apart.

Nothing waits on a worker that is gone: a stopping worker hands back the tasks it has not started (worker.py), a
worker whose heartbeat is late or whose process is gone (seen at once on its own host: serving/processes.py) gets no
new turn (a killed one beats no more before its heartbeat expires), and the live workers send a gone one's queued
turns, and those a worker leaves unclaimed, to the shared queue (housekeeping.reroute_from_gone_workers). A user's
hashes are keyed by their scope, so routing finds only that user's blocks and tells nobody else anything.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import redis
from django.conf import settings

from inference import selectors, transport
from inference.engines.own.block_pool import block_hashes
from inference.limits import LoadState
from inference.metrics import count_route
from inference.models import Generation, ModelPair
from inference.serving import tasks
from inference.serving.processes import process_gone

HASH_BYTES = 8  # of each block hash a worker publishes: a collision can only send a turn to the wrong worker


class RoutedBy(StrEnum):
    CACHE = "cache"  # to the worker holding the most of the prompt
    LOAD = "load"  # to the least busy worker: nobody holds any of it, or its holder is too busy
    SHARED = "shared"  # to the pair's shared queue: no live worker has its own queue yet (Redis just restarted)


@dataclass(frozen=True)
class Candidate:
    """A live worker of the pair as the router sees it."""

    worker: str
    held_blocks: int  # the prompt's leading blocks its main's pool holds
    in_flight: int  # answers routed to it and not ended


@dataclass(frozen=True)
class Routed:
    queue: str
    worker: str  # "" for the shared queue
    by: RoutedBy
    cached_tokens: int  # of the prompt, as the chosen worker's pool held it when routed


def worker_queue(*, pair_queue: str, worker: str) -> str:
    """A worker's own queue for a pair: the router's turns for it."""
    return f"{pair_queue}.{worker}"


def published(hashes: Sequence[bytes]) -> list[bytes]:
    return [digest[:HASH_BYTES] for digest in hashes]


def publish_held(client: redis.Redis, *, worker: str, slug: str, hashes: Sequence[bytes], ttl_s: int) -> None:
    """Replace the set of blocks this worker's pool holds for the pair, in one transaction (a reader never sees it
    half written); it expires with the worker's heartbeat."""
    key = transport.held_blocks_key(worker=worker, slug=slug)
    pipe = client.pipeline(transaction=True)
    pipe.delete(key)
    if hashes:
        pipe.sadd(key, *published(hashes))
        pipe.expire(key, ttl_s)
    pipe.execute()


def send_to_shared_queue(*, generation_id, pair_queue: str) -> None:
    """A queued generation whose worker will not serve it (stopping, or gone) goes to any worker of its pair."""
    Generation.objects.filter(id=generation_id, status=Generation.Status.QUEUED).update(routed_to="")
    tasks.generate.apply_async(args=(str(generation_id),), queue=pair_queue)


def choose(candidates: Sequence[Candidate], *, margin: int) -> tuple[Candidate | None, RoutedBy]:
    """The rule, apart from Redis and the database: the holder of the longest prefix unless it has more than `margin`
    answers in flight above the least busy worker; else the least busy (ties: the one holding more, then any)."""
    if not candidates:
        return None, RoutedBy.SHARED
    least = min(candidate.in_flight for candidate in candidates)
    holder = max(candidates, key=lambda candidate: (candidate.held_blocks, -candidate.in_flight))
    if holder.held_blocks and holder.in_flight - least <= margin:
        return holder, RoutedBy.CACHE
    idle = [candidate for candidate in candidates if candidate.in_flight == least]
    most_held = max(candidate.held_blocks for candidate in idle)
    return random.choice([candidate for candidate in idle if candidate.held_blocks == most_held]), RoutedBy.LOAD


def _held_blocks(client: redis.Redis, *, slug: str, workers: list[dict], prompt_ids: list[int],
                 scope: str) -> dict[str, int]:
    """Worker name -> the prompt's leading blocks it holds (what the engine would find: the last token is always
    read, so its block is not looked up; engines/own/kv_cache.py)."""
    names = [beat["name"] for beat in workers]
    block_tokens = {beat["name"]: beat.get("kv_block_tokens", {}).get(slug) for beat in workers}
    sizes = {size for size in block_tokens.values() if size}
    hashes = {size: published(block_hashes(prompt_ids[:-1], block_tokens=size, scope=scope)) for size in sizes}
    pipe = client.pipeline(transaction=False)
    asked = [name for name in names if hashes.get(block_tokens[name])]
    for name in asked:
        pipe.smismember(transport.held_blocks_key(worker=name, slug=slug), hashes[block_tokens[name]])
    held = dict.fromkeys(names, 0)
    for name, members in zip(asked, pipe.execute(), strict=True):
        held[name] = next((i for i, member in enumerate(members) if not member), len(members))
    return held


def takes_turns(beat: dict) -> bool:
    """Whether a live worker gets new turns and keeps its queued ones: not stopping, its last heartbeat not late (a
    worker killed at once beats no more, though its heartbeat lives until it expires), and its process not known to
    be gone (serving/processes.py: on this host, a killed one is seen at once)."""
    return (not beat.get("stopping") and time.time() - beat.get("beat_at", time.time()) <= settings.ROUTE_BEAT_LATE_S
            and not process_gone(beat.get("process")))


def route(client: redis.Redis, *, pair: ModelPair, workers: list[dict], prompt_ids: list[int],
          scope: str) -> Routed:
    """Where a new generation's task goes (`workers`: the live heartbeats), counted in /metrics by how."""
    serving = [beat for beat in workers if pair.queue in beat.get("queues", ()) and takes_turns(beat)
               and beat.get("pairs", {}).get(pair.slug, {}).get("state") != LoadState.FAILED]
    held = _held_blocks(client, slug=pair.slug, workers=serving, prompt_ids=prompt_ids, scope=scope)
    in_flight = selectors.routed_in_flight(pair=pair)
    candidates = [Candidate(worker=name, held_blocks=held[name], in_flight=in_flight.get(name, 0)) for name in held]
    chosen, by = choose(candidates, margin=settings.ROUTE_LOAD_MARGIN)
    count_route(client=client, pair=pair.slug, by=by)
    if chosen is None:
        return Routed(queue=pair.queue, worker="", by=by, cached_tokens=0)
    block_tokens = next(beat.get("kv_block_tokens", {}).get(pair.slug) or 0 for beat in serving
                        if beat["name"] == chosen.worker)
    return Routed(queue=worker_queue(pair_queue=pair.queue, worker=chosen.worker), worker=chosen.worker, by=by,
                  cached_tokens=chosen.held_blocks * block_tokens)
