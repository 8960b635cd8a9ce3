"""The Redis transport as a closing browser tab uses it: a reader that is cancelled lets go."""

import asyncio
import json
import random
import uuid

import pytest

from inference import transport

pytestmark = pytest.mark.no_database


async def test_a_cancelled_reader_stops_at_once_whenever_the_cancel_lands(redis_client):
    """A chat socket that closes cancels the readers following its answers. A cancel that lands while
    XREAD blocks, arrives or returns must end the reader: one that swallowed it (redis-py 8.0-8.1 did,
    2-4 times in 150) would read a running answer's stream for as long as the answer runs."""
    client = transport.async_client()
    rng = random.Random(12)
    stuck = []
    try:
        for _ in range(120):
            generation_id = uuid.uuid4()
            reader = asyncio.create_task(_read_all(client, generation_id))
            await asyncio.sleep(rng.uniform(0, 0.25))
            reader.cancel()
            done, _pending = await asyncio.wait([reader], timeout=3)
            if not done:
                stuck.append(generation_id)
    finally:
        for generation_id in stuck:  # the answer ends: so does a reader that ignored its cancel
            redis_client.xadd(transport.stream_key(generation_id), {"data": json.dumps({"type": "done"})})
        await client.aclose()
    assert not stuck, f"{len(stuck)} of 120 cancelled readers kept reading"


async def _read_all(client, generation_id) -> None:
    async for _event in transport.follow(client, generation_id, block_ms=100):
        pass
