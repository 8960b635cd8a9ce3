"""Tokens from workers to browsers and HTTP clients: one Redis Stream per generation.

Channel layers are at-most-once (a slow or reconnecting reader loses messages), so the worker
XADDs batched events to `specchat:gen:<id>` and every reader XREADs from the last id it saw. A
reconnecting websocket or an SSE client with Last-Event-ID resumes from its id: nothing is lost,
nothing is read twice. The stream expires some time after the generation ends; the finished
answer lives on in the database.

Event types: start {prompt_tokens, worker}, delta {steps: [[draft_text, main_text], ...]},
done {finish_reason, text, metrics...}, error {message}.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

TERMINAL = {"done", "error"}
# A Redis restart (a few seconds) must not end an answer: commands are retried with backoff for about
# REDIS_RETRY_S before the error reaches the caller.
REDIS_ERRORS = (RedisConnectionError, RedisTimeoutError)
REDIS_RETRIES = 12


def stream_key(generation_id) -> str:
    return f"specchat:gen:{generation_id}"


def cancel_key(generation_id) -> str:
    return f"specchat:cancel:{generation_id}"


def sync_client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, decode_responses=True, retry_on_error=list(REDIS_ERRORS),
                                retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), REDIS_RETRIES))


def async_client() -> aioredis.Redis:
    return aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True, retry_on_error=list(REDIS_ERRORS),
                                   retry=AsyncRetry(ExponentialBackoff(cap=1.0, base=0.05), REDIS_RETRIES))


class StreamWriter:
    """The worker's side: one XADD per event (the caller batches steps into one delta)."""

    def __init__(self, client: redis.Redis, generation_id):
        self.client = client
        self.key = stream_key(generation_id)
        self.cancel = cancel_key(generation_id)

    def send(self, event: dict) -> str:
        pipe = self.client.pipeline(transaction=False)
        pipe.xadd(self.key, {"data": json.dumps(event)})
        pipe.expire(self.key, settings.STREAM_TTL_S)
        entry_id, _ = pipe.execute()
        return entry_id

    def cancel_requested(self) -> bool:
        return bool(self.client.exists(self.cancel))


CANCEL_CHANNEL = "specchat:cancel"


def request_cancel(client: redis.Redis, generation_id) -> None:
    """A flag for whoever starts the generation later, and a message for the worker running it now."""
    pipe = client.pipeline(transaction=False)
    pipe.set(cancel_key(generation_id), "1", ex=settings.STREAM_TTL_S)
    pipe.publish(CANCEL_CHANNEL, str(generation_id))
    pipe.execute()


def append_event(client: redis.Redis, generation_id, event: dict) -> str:
    """Write one event from outside the worker (a stalled generation's error)."""
    return StreamWriter(client, generation_id).send(event)


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


def valid_entry_id(value: str) -> bool:
    """A Redis stream id, as clients send it back in Last-Event-ID or `after`."""
    head, dash, tail = (value or "").partition("-")
    parts = (head, tail) if dash else (head,)
    return all(part.isascii() and part.isdigit() and int(part) < 2**64 for part in parts)
