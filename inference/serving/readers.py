"""Following a generation: its Redis stream read by any number of readers (the chat's sockets, the
API's Server-Sent Events, non-streaming calls), resumed from the last event a reader saw, and ended
from the database when the stream is gone or its worker will never finish it.

The worker appends `start`, then `delta` events (each with `at`, the index of its first step), then
`done` or `error`; a reader that reconnects passes the last entry id it saw (and, in the chat, how many
steps it holds) and gets exactly what follows (StepAligner, also across a stream written again after
a Redis restart).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError
from django.utils import timezone

from inference import errors, transport
from inference.engines.speculation_stats import FIGURES
from inference.models import Generation
from inference.serving.records import fail_generation, reconnecting, stalled_generation_problem

log = logging.getLogger(__name__)

# A reader keeps following a stream while the database is away, this long: a restart or a failover
# takes seconds; past it the reader is told, and its answer's record ends it once the database is back.
DATABASE_PATIENCE_S = 60
ENDED = {"type": "ended", "message": "This answer has ended: nothing follows the event asked for."}


REDIS_LOST = "Lost the connection to Redis. Reload to see the answer as it was saved."
INTERRUPTED = ("The stream of this answer was interrupted (Redis restarted) and cannot be resumed from "
               "where it was: reload to see the answer as saved.")


class StepAligner:
    """Keeps a reader's place in a generation's steps across a stream the worker wrote again (a Redis
    restart): deltas it already has are dropped or trimmed, a gap waits for the replay that fills it.
    `known`: steps the reader has, None if it resumes without saying (then a replay cannot be aligned)."""

    def __init__(self, *, known: int | None, resumed: bool):
        self.position = known
        self.started = resumed

    def align(self, event: dict) -> dict | None:
        """The event to pass on, None to skip it; ValueError when a replay cannot be aligned."""
        if event["type"] == "start":
            skip = self.started
            self.started = True
            return None if skip else event
        if event["type"] != "delta" or "at" not in event:
            return event
        at, steps = event["at"], event["steps"]
        if self.position is None:
            if event.get("replay"):
                raise ValueError(INTERRUPTED)
            self.position = at
        if at > self.position:
            return None  # a gap: the stream was lost; the worker's replay (at 0) follows
        fresh = steps[self.position - at:]
        if not fresh:
            return None
        event = {**event, "at": self.position, "steps": fresh}
        event.pop("replay", None)
        self.position += len(fresh)
        return event


async def follow_generation(*, generation_id, after: str = "0-0", known_steps: int | None = None):
    """The generation's events after `after`, then a terminal one. A queued generation that no
    live worker serves, or a running one whose worker stopped beating, ends with an error event;
    a follower past the end of an ended generation gets (None, ENDED), never silence; Redis lost
    for longer than the transport's retries ends with (None, error), and so does the database for
    longer than DATABASE_PATIENCE_S (while it is away, the stream is followed on). `known_steps`: how many steps a
    resuming reader has, so that a stream written again after a Redis restart continues exactly."""
    client = transport.async_client()
    quiet_since = time.monotonic()
    last = after or "0-0"
    resumed = last != "0-0"
    aligner = StepAligner(known=known_steps if resumed else 0, resumed=resumed)
    database_lost_at: float | None = None
    try:
        async for entry_id, event in transport.follow(client, generation_id, after=after):
            if entry_id is not None:
                quiet_since, last = time.monotonic(), entry_id
                try:
                    aligned = aligner.align(event)
                except ValueError as exc:
                    yield None, {"type": "error", "message": str(exc)}
                    return
                if aligned is not None:
                    yield entry_id, aligned
                continue
            yield None, event  # idle: lets the caller keep its connection alive
            try:
                if await sync_to_async(nothing_after)(generation_id=generation_id, seen=last):
                    record = await sync_to_async(ending_from_record)(generation_id=generation_id, seen=last,
                                                                     aligner=aligner)
                    for item in record or [(None, ENDED)]:
                        yield item
                    return
                if time.monotonic() - quiet_since >= 2:
                    failed = await sync_to_async(_fail_if_stalled)(generation_id=generation_id)
                    if failed:
                        yield failed
                        return
                    quiet_since = time.monotonic()
                database_lost_at = None
            except DatabaseError:  # the stream goes on meanwhile: its worker may still end the answer
                database_lost_at = database_lost_at or time.monotonic()
                if time.monotonic() - database_lost_at >= DATABASE_PATIENCE_S:
                    yield None, {"type": "error", "message": errors.DATABASE_DOWN}
                    return
    except transport.REDIS_ERRORS:  # its message names Redis's host and port: for the log, not the reader
        log.exception("following generation %s: Redis did not answer", generation_id)
        yield None, {"type": "error", "message": REDIS_LOST}
    finally:
        await client.aclose()


@reconnecting
def _fail_if_stalled(*, generation_id) -> tuple[str, dict] | None:
    """The error event of a generation its worker will never finish, failed now; None if it is
    healthy, or finished meanwhile (its last events are then on the stream)."""
    problem = stalled_generation_problem(generation_id=generation_id)
    error_id = fail_generation(generation_id=generation_id, message=problem) if problem else None
    return (error_id, {"type": "error", "message": problem}) if error_id else None


END_GRACE_S = 5  # a worker writes the record, then the terminal event: it may lag the record this long


@reconnecting
def nothing_after(*, generation_id, seen: str) -> bool:
    """True once the generation has ended and its stream holds nothing after `seen`: the reader
    already read the terminal event, asked past it, or the stream expired. The record ends a moment
    before the worker appends `done`; a reader that saw the record but not yet the event waits for it
    (else the stream would end without its usage)."""
    finished_at = Generation.objects.filter(id=generation_id, status__in=[
        Generation.Status.FINISHED, Generation.Status.STOPPED, Generation.Status.FAILED]).values_list(
        "finished_at", flat=True).first()
    if finished_at is None:
        return False
    last: Any = transport.sync_client().xrevrange(transport.stream_key(generation_id), count=1)
    if last and transport.entry_key(last[0][0]) > transport.entry_key(seen):
        return False  # more to read
    if last and json.loads(last[0][1]["data"]).get("type") in transport.TERMINAL:
        return True
    return (timezone.now() - finished_at).total_seconds() >= END_GRACE_S


DONE_FIELDS = ("finish_reason", "text", "prompt_tokens", "cached_tokens", *FIGURES, "speculative_mode",
               "speculative_reason", "speculative_k", "speculative_route", "speculative_reason_codes")


@reconnecting
def ending_from_record(*, generation_id, seen: str, aligner: StepAligner) -> list[tuple[str | None, dict]]:
    """When an ended generation's stream is gone (expired, or lost with a Redis restart) before the
    reader saw its end: the rest from the database (its steps after the reader's place, and the end),
    under the id the reader last saw. [] when the stream is there (the reader saw the end)."""
    if transport.sync_client().exists(transport.stream_key(generation_id)):
        return []
    generation = Generation.objects.get(id=generation_id)
    if generation.status == Generation.Status.FAILED:
        return [(seen, {"type": "error", "message": generation.error})]
    if aligner.position is None:
        return [(None, {"type": "error", "message": INTERRUPTED})]
    rest = [(seen, {"type": "delta", "at": aligner.position, "steps": generation.steps[aligner.position:]})]
    done = {"type": "done", **{name: getattr(generation, name) for name in DONE_FIELDS}}
    return [*rest[:1 if len(generation.steps) > aligner.position else 0], (seen, done)]


async def wait_for(*, generation_id) -> Generation:
    """The generation once it has ended (used by non-streaming API calls and tests)."""
    async for _, event in follow_generation(generation_id=generation_id):
        if event["type"] in transport.TERMINAL:
            break
    return await Generation.objects.aget(id=generation_id)

