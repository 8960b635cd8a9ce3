"""A generation's Redis stream as Server-Sent Events in OpenAI's chunk format.

Every event carries `id:` = the Redis stream entry it came from (when one entry becomes several
events, the last carries the id), so a client that reconnects with `Last-Event-ID` gets exactly
the events after it. The connection that started a generation owns it: if that client goes away,
the generation is stopped at the worker's next step, unless it was started with `background: true`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import StreamingHttpResponse

from inference import services, transport
from inference.api import auth
from inference.api.shapes import Shape, error_body
from inference.models import Generation

KEEPALIVE_S = 15  # a comment line this often keeps proxies from closing a quiet stream


def frame(payload: dict | str, *, event_id: str | None = None) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}data: {data}\n\n".encode()


def response(stream: AsyncIterator[bytes], *, generation: Generation) -> StreamingHttpResponse:
    reply = StreamingHttpResponse(stream, content_type="text/event-stream; charset=utf-8")
    reply["Cache-Control"] = "no-cache"
    reply["X-Accel-Buffering"] = "no"
    reply["X-Generation-Id"] = str(generation.id)
    return reply


def _entry_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _nothing_more(generation_id, seen: str) -> bool:
    """True once the generation has ended and its stream holds nothing after `seen` (the client
    already read the end, or the stream expired): there is nothing left to wait for."""
    if not Generation.objects.filter(id=generation_id, status__in=[
            Generation.Status.FINISHED, Generation.Status.STOPPED, Generation.Status.FAILED]).exists():
        return False
    last = transport.sync_client().xrevrange(transport.stream_key(generation_id), count=1)
    return not last or _entry_key(last[0][0]) <= _entry_key(seen)


REVOKED = services.GenerationRequestError("The API key was revoked (or its owner deactivated) during this stream.",
                                          code="invalid_api_key", status=401)


async def events(*, generation: Generation, shape: Shape, after: str, include_usage: bool,
                 owner: bool) -> AsyncIterator[bytes]:
    """The generation's chunks after entry `after`, ending with `data: [DONE]`. `owner`: this
    connection started the generation, so its disconnect stops it (background generations aside).
    Every ACCESS_RECHECK_S the key is checked again: a revoked key's stream ends with an error."""
    seen, ended, quiet_since = after, False, time.monotonic()
    checked_at = time.monotonic()
    try:
        async with aclosing(services.follow_generation(generation_id=generation.id, after=after)) as follow:
            async for entry_id, event in follow:
                if time.monotonic() - checked_at >= settings.ACCESS_RECHECK_S:
                    checked_at = time.monotonic()
                    if not await sync_to_async(auth.key_is_usable)(api_key_id=generation.api_key_id):
                        if owner:
                            await sync_to_async(services.request_stop)(generation=generation)
                        ended = True
                        yield frame(error_body(REVOKED))
                        yield frame("[DONE]")
                        return
                if entry_id is None:
                    if await sync_to_async(_nothing_more)(generation.id, seen):
                        ended = True
                        yield frame("[DONE]")
                        return
                    if time.monotonic() - quiet_since >= KEEPALIVE_S:
                        quiet_since = time.monotonic()
                        yield b": keep-alive\n\n"
                    continue
                payloads = shape.payloads(event, include_usage=include_usage)
                ended = event["type"] in transport.TERMINAL
                seen, quiet_since = entry_id, time.monotonic()
                for index, payload in enumerate(payloads):
                    yield frame(payload, event_id=entry_id if index == len(payloads) - 1 else None)
    except (asyncio.CancelledError, GeneratorExit):
        # The client went away (Django cancels the response task, or closes this iterator).
        # A plain Redis SET, called directly: nothing may be awaited reliably in a cancelled task.
        if owner and not ended:
            services.request_stop(generation=generation)
        raise
