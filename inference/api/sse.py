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
from django.db import DatabaseError
from django.http import StreamingHttpResponse

from inference import errors, transport
from inference.api import auth
from inference.api.shapes import Shape, error_body
from inference.api.tools import CallStream
from inference.models import Generation
from inference.serving import readers, web
from inference.serving.records import reconnecting

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


REVOKED = errors.InvalidKey("The API key was revoked (or its owner deactivated) during this stream.")


async def _key_revoked(generation: Generation) -> bool:
    try:
        return not await sync_to_async(reconnecting(auth.key_is_usable))(api_key_id=generation.api_key_id)
    except DatabaseError:  # away for a moment (a restart): checked again at the next recheck
        return False


async def _follow(*, generation: Generation, shape: Shape, after: str, calls: CallStream | None):
    """The generation's events after `after`. A tool-reading answer's content depends on all its text before:
    resumed mid-way, it is read from the start and the events up to `after` only feed `calls`."""
    replayed = transport.entry_key(after) if calls is not None and after != "0-0" else None
    async with aclosing(readers.follow_generation(generation_id=generation.id,
                                                  after="0-0" if replayed else after)) as follow:
        async for entry_id, event in follow:
            if replayed and entry_id is not None and transport.entry_key(entry_id) <= replayed:
                shape.payloads(event, include_usage=False, calls=calls)
                continue
            yield entry_id, event


async def events(*, generation: Generation, shape: Shape, after: str, include_usage: bool,
                 owner: bool) -> AsyncIterator[bytes]:
    """The generation's chunks after entry `after`, ending with `data: [DONE]`. `owner`: this
    connection started the generation, so its disconnect stops it (background generations aside).
    Every ACCESS_RECHECK_S the key is checked again: a revoked key's stream ends with an error."""
    ended, quiet_since = False, time.monotonic()
    checked_at = time.monotonic()
    calls = CallStream() if shape.tool_calls else None
    try:
        async with aclosing(_follow(generation=generation, shape=shape, after=after, calls=calls)) as follow:
            async for entry_id, event in follow:
                if time.monotonic() - checked_at >= settings.ACCESS_RECHECK_S:
                    checked_at = time.monotonic()
                    if await _key_revoked(generation):
                        if owner:
                            await sync_to_async(web.request_stop)(generation=generation)
                        ended = True
                        yield frame(error_body(REVOKED))
                        yield frame("[DONE]")
                        return
                if event is readers.ENDED:
                    ended = True
                    yield frame("[DONE]")
                    return
                if entry_id is None and event["type"] == "error":  # Redis lost for good
                    ended = True
                    for payload in shape.payloads(event, include_usage=include_usage):
                        yield frame(payload)
                    return
                if entry_id is None:
                    if time.monotonic() - quiet_since >= KEEPALIVE_S:
                        quiet_since = time.monotonic()
                        yield b": keep-alive\n\n"
                    continue
                payloads = shape.payloads(event, include_usage=include_usage, calls=calls)
                ended = event["type"] in transport.TERMINAL
                quiet_since = time.monotonic()
                for index, payload in enumerate(payloads):
                    yield frame(payload, event_id=entry_id if index == len(payloads) - 1 else None)
    except (asyncio.CancelledError, GeneratorExit):
        # The client went away (Django cancels the response task, or closes this iterator).
        # A plain Redis SET, called directly: nothing may be awaited reliably in a cancelled task.
        if owner and not ended:
            web.request_stop(generation=generation)
        raise
