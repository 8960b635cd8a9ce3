"""What a worker does between answers to keep the records true (lifecycle calls it as the worker beats): send
again the task of a generation the broker lost, and fail the generations nobody will finish (this worker's
stuck or unsaved ones, other workers' gone with them, queued ones no worker will take)."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from inference import selectors, transport
from inference.models import Generation, ModelPair
from inference.serving import routing, tasks
from inference.serving.records import NOT_SAVED, UNSERVED_AFTER_S, fail_generation, queued_problem, worker_died
from inference.serving.worker import NEVER_STARTED, NOT_STOPPED, OVERRUN_GRACE_S, STATE

log = logging.getLogger(__name__)


def resend_lost_generations(*, client, queues: list[str]) -> None:
    """Send again the task of a generation queued for longer than REQUEUE_AFTER_S on a pair this
    worker serves (called only while it has a free slot, so nothing legitimately waits for it): the
    claim in run_generation makes a second delivery harmless. Still queued after QUEUE_TIMEOUT_S: failed
    (fail_unservable_generations)."""
    now = timezone.now()
    slugs = [queue.removeprefix("pair.") for queue in queues if queue.startswith("pair.")]
    stale = Generation.objects.filter(status=Generation.Status.QUEUED, pair__slug__in=slugs,
                                      created_at__lt=now - timedelta(seconds=settings.REQUEUE_AFTER_S))
    for generation_id, slug in stale.values_list("id", "pair__slug"):
        if client.set(transport.resent_key(generation_id), "1", nx=True, ex=settings.REQUEUE_AFTER_S):
            log.warning("generation %s was queued for %s s: sending its task again", generation_id,
                        settings.REQUEUE_AFTER_S)
            tasks.generate.apply_async(args=(str(generation_id),), queue=f"pair.{slug}")


def reconcile_claimed_generations(*, worker_name: str) -> None:
    """End this worker's `running` records that none of its threads holds any more: an answer whose
    final write failed (its readers were told it was not saved) must not stay running, holding its slot.
    And those whose thread is stuck past settings.MAX_ANSWER_S (overdue_problem)."""
    running = list(Generation.objects.filter(status=Generation.Status.RUNNING, worker=worker_name)
                   .values_list("id", flat=True))
    claimed = set(STATE.claimed)  # read after the rows: a thread holds a generation before its row is running
    for generation_id in running:
        if str(generation_id) not in claimed:
            log.warning("generation %s is running in the database but not on this worker: failed", generation_id)
            fail_generation(generation_id=generation_id, message=NOT_SAVED)
        elif problem := overdue_problem(generation_id=str(generation_id), limit=settings.MAX_ANSWER_S):
            log.warning("generation %s is stuck on this worker: failed (%s)", generation_id, problem)
            fail_generation(generation_id=generation_id, message=problem)


def stop_unwatched_chat_answers(*, client) -> None:
    """Stop this worker's chat answers that no chat page has watched for CHAT_ABANDON_GRACE_S: the chat's sockets
    mark the answers they follow (chatsite/chat/watching.py) and stop them when they close, but an answer started by
    an HTTP action (an edit) with no page open, or followed by a web process that died, was left running to its cap.
    The API's answers run on: a script may read them later (events with Last-Event-ID)."""
    running = list(STATE.running)
    if not running or not selectors.redis_up_for(client=client, seconds=2 * settings.ACCESS_RECHECK_S):
        return  # Redis just restarted: the pages mark the answers they watch again at their next recheck
    started_before = timezone.now() - timedelta(seconds=settings.CHAT_ABANDON_GRACE_S)
    chat = Generation.objects.filter(id__in=running, source=Generation.Source.CHAT, status=Generation.Status.RUNNING,
                                     started_at__lt=started_before).values_list("id", flat=True)
    fresh_since = time.time() - max(3 * settings.ACCESS_RECHECK_S, settings.CHAT_ABANDON_GRACE_S)
    for generation_id in chat:
        request = STATE.running.get(str(generation_id))
        if request is not None and not client.zcount(transport.chat_watchers_key(generation_id), fresh_since, "+inf"):
            log.info("chat answer %s is watched by no page: stopped", generation_id)
            request.stop()


def overdue_problem(*, generation_id: str, limit: int) -> str:
    """Why a claimed answer's thread, stuck, will not end it, or '': an engine that has not taken it `limit` s
    after it was handed over (a submit that hangs: the answer's own limit starts only once it runs), or one
    that ran past the limit and the grace Answer._overrun gives it without ending (a stop that hangs too)."""
    if not limit:
        return ""
    request = STATE.running.get(generation_id)
    if request is None:
        since = STATE.submitting.get(generation_id)
        return NEVER_STARTED.format(limit=limit) if since and time.perf_counter() - since >= limit else ""
    if time.perf_counter() - request.added_at >= limit + 2 * OVERRUN_GRACE_S:
        return NOT_STOPPED.format(limit=limit)
    return ""


def fail_unservable_generations(*, client) -> None:
    """Fail the queued generations no worker will pick up (their pair's workers are gone, or it never became
    available), read or not: a background API request nobody follows must end too, and free its key's slot.
    Every live worker calls this as it beats, for every pair: the pair's own workers may be the ones gone."""
    if not selectors.heartbeats_settled(client=client):
        return  # Redis just restarted: the other workers' heartbeats are not back yet
    now = timezone.now()
    queued = list(Generation.objects.filter(
        status=Generation.Status.QUEUED, created_at__lt=now - timedelta(seconds=UNSERVED_AFTER_S))
        .values_list("id", "pair_id", "created_at"))
    if not queued:
        return
    workers = selectors.live_workers(client=client)
    pairs = ModelPair.objects.in_bulk({pair_id for _, pair_id, _ in queued})
    for generation_id, pair_id, created_at in queued:
        problem = queued_problem(pair=pairs[pair_id], waited=(now - created_at).total_seconds(), workers=workers)
        if problem:
            fail_generation(generation_id=generation_id, message=problem)


def reroute_from_gone_workers(*, client) -> None:
    """Send to their pair's shared queue the queued generations routed to a worker whose heartbeat expired or is
    late, or that is stopping: its own queue would hold them until they timed out. And those a worker with a free
    slot has left unclaimed for ROUTE_UNCLAIMED_S: a live worker claims a turn within milliseconds, so it is hung, or
    killed where its process cannot be seen (another host or container), and its heartbeat looks fresh for seconds
    yet. A second delivery (the stopping worker hands its turns back too; a hung worker wakes) is harmless: the row's
    claim, and the worker's (WorkerState.claim)."""
    if not selectors.heartbeats_settled(client=client):
        return
    routed = list(Generation.objects.filter(status=Generation.Status.QUEUED).exclude(routed_to="")
                  .values_list("id", "routed_to", "pair__slug", "created_at"))
    if not routed:
        return
    serving = {beat["name"]: beat for beat in selectors.live_workers(client=client) if routing.takes_turns(beat)}
    now = timezone.now()
    for generation_id, worker, slug, created_at in routed:
        beat = serving.get(worker)
        unclaimed = beat is not None and _has_free_slot(beat) and (
            (now - created_at).total_seconds() > settings.ROUTE_UNCLAIMED_S)
        if (beat is None or unclaimed) and client.set(transport.resent_key(generation_id), "1", nx=True,
                                                      ex=settings.REQUEUE_AFTER_S):
            log.warning("generation %s was routed to %s, which is %s: sent to any worker of %s", generation_id,
                        worker, "not claiming it" if unclaimed else "gone", slug)
            routing.send_to_shared_queue(generation_id=generation_id, pair_queue=f"pair.{slug}")


def _has_free_slot(beat: dict) -> bool:
    """As its last heartbeat said: a worker whose slots are all taken leaves its turns queued until one frees."""
    return int(beat.get("active", 0)) < int(beat.get("slots", settings.WORKER_SLOTS))


def fail_orphaned_generations(*, client) -> None:
    """Fail the running generations of workers whose heartbeat expired, read or not (a background
    API request nobody follows must not stay 'running' forever). Live workers call this as they beat."""
    if not selectors.heartbeats_settled(client=client):
        return  # Redis just restarted: the other workers' heartbeats are not back yet
    running = list(Generation.objects.filter(status=Generation.Status.RUNNING).exclude(worker="")
                   .values_list("id", "worker"))
    dead = {worker for worker in {w for _, w in running} if not selectors.worker_is_alive(client=client, name=worker)}
    for generation_id, worker in running:
        if worker in dead:
            fail_generation(generation_id=generation_id, message=worker_died(worker))
