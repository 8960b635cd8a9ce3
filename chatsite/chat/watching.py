"""Who watches an answer: the chat connections following an answer mark it watched in Redis; once the last one
has closed and none came back within a grace period (CHAT_ABANDON_GRACE_S: a reload, a network blip), the
answer is stopped."""

import asyncio
import time

from channels.db import database_sync_to_async
from django.conf import settings

from inference import transport
from inference.models import Generation
from inference.serving import web

_abandoned: set[asyncio.Task] = set()  # stop checks that outlive their connection


async def watch(*, client, generation_ids, connection_id: str) -> None:
    """Mark the answers watched by this connection now; each connection repeats this every
    ACCESS_RECHECK_S, so the marks of a web process that died go stale."""
    now = time.time()
    pipe = client.pipeline(transaction=False)
    for generation_id in generation_ids:
        pipe.zadd(transport.chat_watchers_key(generation_id), {connection_id: now})
        pipe.expire(transport.chat_watchers_key(generation_id), settings.STREAM_TTL_S)
    await pipe.execute()


async def unwatch(*, client, generation_ids, connection_id: str) -> None:
    pipe = client.pipeline(transaction=False)
    for generation_id in generation_ids:
        pipe.zrem(transport.chat_watchers_key(generation_id), connection_id)
    await pipe.execute()


def stop_unwatched(*, generation_ids) -> None:
    """Stop those of the answers (still in flight) that no chat connection watches."""
    client = transport.sync_client()
    fresh_since = time.time() - 3 * settings.ACCESS_RECHECK_S
    for generation in Generation.objects.filter(id__in=list(generation_ids), status__in=web.IN_FLIGHT):
        if not client.zcount(transport.chat_watchers_key(generation.id), fresh_since, "+inf"):
            web.request_stop(generation=generation)


async def leave(*, client, generation_ids: list[str], connection_id: str) -> None:
    """A connection closed: its marks go, and the answers nobody watches once the grace period is over are
    stopped."""
    await unwatch(client=client, generation_ids=generation_ids, connection_id=connection_id)
    task = asyncio.create_task(_stop_if_abandoned(generation_ids))
    _abandoned.add(task)
    task.add_done_callback(_abandoned.discard)


async def _stop_if_abandoned(generation_ids: list[str]) -> None:
    """After a grace period for a reconnect (a reload, a network blip), stop the answers nobody watches."""
    await asyncio.sleep(settings.CHAT_ABANDON_GRACE_S)
    # In the shared pool: the connection's own thread is gone.
    await database_sync_to_async(stop_unwatched, thread_sensitive=False)(generation_ids=generation_ids)
