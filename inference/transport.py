"""Tokens from workers to browsers and HTTP clients: one Redis Stream per generation.

Channel layers are at-most-once (a slow or reconnecting reader loses messages), so the worker
XADDs batched events to `specchat:gen:<id>` and every reader XREADs from the last id it saw. A
reconnecting websocket or an SSE client with Last-Event-ID resumes from its id: nothing is lost,
nothing is read twice. The stream expires some time after the generation ends; the finished
answer lives on in the database.

Event types: start {prompt_tokens, worker}, prompt {read, total} (a long prompt's prefill, how far it got),
delta {at, steps: [[draft_text, main_text], ...]},
done {finish_reason, text, metrics...}, error {message}. A Redis restart loses the stream: the worker
then writes its history again (see StreamWriter) and readers align on the deltas' `at`.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.driver_info import DriverInfo
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

TERMINAL = {"done", "error"}
# A Redis restart (a few seconds) must not end an answer: commands are retried with backoff for about
# REDIS_RETRY_S before the error reaches the caller.
REDIS_ERRORS = (RedisConnectionError, RedisTimeoutError)
REDIS_RETRIES = 12


# Every Redis key the product uses, here so that none collides and an operator can find them all.
PREFIX = "specchat:"
CANCEL_CHANNEL = PREFIX + "cancel"  # pub/sub: stop this generation now
CONTROL_CHANNEL = PREFIX + "control:{db}"  # pub/sub, per database (channels are not): load or unload a pair
METRICS_KEY = PREFIX + "metrics"  # hash: Prometheus samples (inference/metrics.py)
WORKER_KEY_PREFIX = PREFIX + "worker:"  # + worker name: its heartbeat, expiring with it
WORKER_INDEX = PREFIX + "workers"  # sorted set: worker names by heartbeat expiry (read, not the keyspace scanned)


def stream_key(generation_id) -> str:
    """A generation's events (a Redis Stream)."""
    return f"{PREFIX}gen:{generation_id}"


def cancel_key(generation_id) -> str:
    """Set when a generation's stop was asked, for whoever starts it later."""
    return f"{PREFIX}cancel:{generation_id}"


def resent_key(generation_id) -> str:
    """Set once a worker sent a generation's lost task again (one resend per REQUEUE_AFTER_S)."""
    return f"{PREFIX}resent:{generation_id}"


def held_blocks_key(*, worker: str, slug: str) -> str:
    """Set: the hashes of the blocks a worker's main holds for a pair, expiring with the worker (serving/routing.py)."""
    return f"{PREFIX}held:{slug}:{worker}"


def slot_lock(kind: str, owner_id) -> str:
    """The lock around counting and taking the in-flight slots of an API key ("apikey") or a chat user
    ("chat")."""
    return f"{PREFIX}{kind}-lock:{owner_id}"


def chat_watchers_key(generation_id) -> str:
    """Sorted set: the chat connections following a generation, by when they last said so."""
    return f"{PREFIX}chat-watchers:{generation_id}"


# Told its own version, redis-py does not read its package metadata again for every new connection, a cost on the
# path of every request's first token (docs/benchmark-log.md, "The stack's overhead at one stream").
_DRIVER = DriverInfo(lib_version=redis.__version__)


def sync_client() -> redis.Redis:
    """This process's client: one connection pool, shared by its threads. A client per call connected
    afresh every time, three times per request in the web and twice in the worker."""
    return _shared_sync_client(settings.REDIS_URL)


@functools.cache
def _shared_sync_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True, driver_info=_DRIVER, retry_on_error=list(REDIS_ERRORS),
                                retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), REDIS_RETRIES))


def fail_fast_client() -> redis.Redis:
    """This process's client for a read the caller can do without: it does not retry while Redis is away
    (sync_client's retries wait ~12 s), so registering a pair needs no Redis (pair_checks.registrable_devices)."""
    return _fail_fast_client(settings.REDIS_URL)


@functools.cache
def _fail_fast_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True, driver_info=_DRIVER, socket_connect_timeout=2,
                                socket_timeout=5)


def async_client() -> aioredis.Redis:
    """A client of its own for the caller's event loop (an asyncio connection cannot move between loops)."""
    return aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True, driver_info=_DRIVER,
                                   retry_on_error=list(REDIS_ERRORS),
                                   retry=AsyncRetry(ExponentialBackoff(cap=1.0, base=0.05), REDIS_RETRIES))


# XADD only if the stream still holds the events this writer sent (a Redis restart without persistence
# loses it): otherwise nothing is written and the writer sends its history again first.
_GUARDED_XADD = """
if redis.call('XLEN', KEYS[1]) ~= tonumber(ARGV[1]) then return false end
local id = redis.call('XADD', KEYS[1], '*', 'data', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return id
"""


class StreamWriter:
    """The worker's side: one XADD per event (the caller batches steps into one delta). Each delta
    carries `at`, the index of its first step, so a reader can align what it reads. If the stream was
    lost (Redis restarted), the writer sends a `start` and one delta of every step so far (at 0)
    before the next event: a reader that kept its place skips what it has, nothing is lost."""

    def __init__(self, client: redis.Redis, generation_id):
        self.client = client
        self.key = stream_key(generation_id)
        self.cancel = cancel_key(generation_id)
        self.start: dict | None = None
        self.steps: list = []
        self.written = 0  # events in the stream as this writer left it
        self.replays = 0
        self._xadd = client.register_script(_GUARDED_XADD)

    def send(self, event: dict) -> str:
        if event.get("type") == "delta":
            event = {**event, "at": len(self.steps)}
        entry_id = self._xadd(keys=[self.key], args=[self.written, json.dumps(event), settings.STREAM_TTL_S])
        if entry_id:
            self.written += 1
        else:
            entry_id = self._replay_then(event)
        if event["type"] == "start":
            self.start = event
        elif event["type"] == "delta":
            self.steps += event["steps"]
        return entry_id

    def _replay_then(self, event: dict) -> str:
        self.replays += 1
        history = ([self.start] if self.start else []) + (
            [{"type": "delta", "at": 0, "steps": self.steps, "replay": True}] if self.steps else [])
        pipe = self.client.pipeline(transaction=True)
        for past in [*history, event]:
            pipe.xadd(self.key, {"data": json.dumps(past)})
        pipe.expire(self.key, settings.STREAM_TTL_S)
        pipe.xlen(self.key)
        *ids, _, self.written = pipe.execute()
        return ids[-1]

    def cancel_requested(self) -> bool:
        return bool(self.client.exists(self.cancel))



def request_cancel(client: redis.Redis, generation_id) -> None:
    """A flag for whoever starts the generation later, and a message for the worker running it now."""
    pipe = client.pipeline(transaction=False)
    pipe.set(cancel_key(generation_id), "1", ex=settings.STREAM_TTL_S)
    pipe.publish(CANCEL_CHANNEL, str(generation_id))
    pipe.execute()


def control_channel(client: redis.Redis) -> str:
    return CONTROL_CHANNEL.format(db=client.connection_pool.connection_kwargs.get("db", 0))


def send_control(client: redis.Redis, *, command: str, slug: str) -> int:
    """A command for every live worker (they listen as they do for cancels, not on Celery's remote
    control, whose fan-out crashed workers on a Redis restart); how many workers received it."""
    received: int = client.publish(control_channel(client), json.dumps({"command": command, "slug": slug}))  # type: ignore[assignment]
    return received


def append_event(client: redis.Redis, generation_id, event: dict) -> str:
    """Write one event from outside the worker (a stalled generation's error)."""
    pipe = client.pipeline(transaction=False)
    pipe.xadd(stream_key(generation_id), {"data": json.dumps(event)})
    pipe.expire(stream_key(generation_id), settings.STREAM_TTL_S)
    entry_id, _ = pipe.execute()
    return entry_id


async def follow(
    client: aioredis.Redis, generation_id, *, after: str = "0-0", block_ms: int = 1000
) -> AsyncIterator[tuple[str | None, dict]]:
    """Events after `after`, as they come, until a terminal one. Yields (None, {"type": "idle"})
    after each quiet `block_ms` so the caller can send keep-alives and check the worker is alive."""
    key = stream_key(generation_id)
    last = after or "0-0"
    while True:
        batches: Any = await client.xread({key: last}, block=block_ms, count=200)  # str, with decode_responses
        if not batches:
            yield None, {"type": "idle"}
            continue
        for entry_id, fields in batches[0][1]:
            last = entry_id
            event = json.loads(fields["data"])
            yield entry_id, event
            if event.get("type") in TERMINAL:
                return


def entry_key(entry_id: str) -> tuple[int, int]:
    """A stream id as a sortable pair: "1700000000000-3" -> (1700000000000, 3)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def valid_entry_id(value: str) -> bool:
    """A Redis stream id, as clients send it back in Last-Event-ID or `after`: one or two 64-bit numbers
    (their digits counted first: Python refuses int() of over 4,300)."""
    head, dash, tail = (value or "").partition("-")
    parts = (head, tail) if dash else (head,)
    return all(part.isascii() and part.isdigit() and len(part) <= len(str(2**64)) and int(part) < 2**64
               for part in parts)


def live_workers(*, client: redis.Redis) -> list[dict]:
    """Heartbeats that have not expired: {name, queues, pairs: {slug: {state, error}}, active, slots, devices}."""
    names: Any = client.zrangebyscore(WORKER_INDEX, time.time(), "+inf")  # str, with decode_responses
    if not names:
        return []
    heartbeats: Any = client.mget([WORKER_KEY_PREFIX + name for name in names])
    return [json.loads(raw) for raw in heartbeats if raw]
