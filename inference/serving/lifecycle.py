"""What a Celery worker process does besides running tasks: announce itself and load its pairs.

Every few seconds a worker writes a heartbeat with expiry to Redis: its queues, the state of each pair it
holds, how many generations it is running and the devices its OpenVINO runtime lists. The web side reads these
to say which pairs are AVAILABLE and to fail fast when nobody serves a pair; the workers read them to fail the
generations of a worker that died. In the background the worker loads the pairs of the queues it consumes, at
start and whenever one is registered later (a pair is also loaded on first request).
"""

from __future__ import annotations

import json
import logging
import threading
import time

from celery.signals import worker_ready, worker_shutdown, worker_shutting_down
from celery.worker.consumer import Consumer
from django.conf import settings
from django.db import DatabaseError, close_old_connections

from inference import jobs, transport
from inference.engines.devices import runtime_devices
from inference.models import BenchmarkRun, HostCalibration, ModelPair
from inference.pairs.importer import fail_abandoned_imports
from inference.serving import calibrated, planning, routing
from inference.serving.host import this_host
from inference.serving.housekeeping import (
    fail_orphaned_generations,
    fail_unservable_generations,
    reconcile_claimed_generations,
    reroute_from_gone_workers,
    resend_lost_generations,
    stop_unwatched_chat_answers,
)
from inference.serving.planning import pair_default_route
from inference.serving.processes import process_gone, this_process
from inference.serving.worker import (
    STATE,
    WORKER_NAME,
    host_figures,
    load_engine,
    publish_held_blocks,
    stop_running,
)

log = logging.getLogger(__name__)
_queues: list[str] = []
_loading: set[str] = set()  # slugs being loaded by _load threads
_consumer: list[Consumer] = []  # the worker's task consumer: its queues change only in its event loop (call_soon)
_stop = threading.Event()


def announce_worker(*, client, name: str, payload: dict, ttl_s: int) -> None:
    """A worker's heartbeat: its key expires with it, and the index forgets expired names."""
    now = time.time()
    pipe = client.pipeline(transaction=False)
    pipe.set(transport.WORKER_KEY_PREFIX + name, json.dumps({**payload, "beat_at": now}), ex=ttl_s)
    pipe.zadd(transport.WORKER_INDEX, {name: now + ttl_s})
    pipe.zremrangebyscore(transport.WORKER_INDEX, "-inf", now)
    pipe.execute()


def retire_worker(*, client, name: str) -> None:
    client.delete(transport.WORKER_KEY_PREFIX + name)
    client.zrem(transport.WORKER_INDEX, name)


def heartbeat_payload() -> dict:
    return {
        "name": WORKER_NAME,
        "queues": _queues,
        "pairs": dict(STATE.engines.states),
        "active": STATE.engines.active_requests(),
        "engines": STATE.engines.loaded(),
        "slots": settings.WORKER_SLOTS,
        "devices": list(runtime_devices()),  # what pairs may name (pair_checks.registrable_devices)
        "host_facts": this_host().facts,  # whose calibrations the chat weighs its answers against (device aside)
        # {slug: {streams: {K: tok/s}}}: what the plans follow (serving/rates.py), for /metrics
        "figures": {slug: rates.figures() for slug, rates in STATE.engines.rates.items()},
        "prefix_cache_bytes": STATE.engines.prefix_cache_bytes(),  # {slug: bytes}, for /metrics
        "kv_blocks_held": STATE.engines.kv_blocks_held(),  # {slug: blocks}, for /metrics and the soak's leak check
        "lone_k": STATE.lone_k,
        # {slug: tokens per block of the main's pool}: how the web side hashes a prompt to find it here (routing.py)
        "kv_block_tokens": {slug: block_tokens for slug, (block_tokens, _) in STATE.engines.main_blocks().items()},
        "stopping": STATE.stopping,  # the web side routes nothing new here
        "process": this_process(),  # killed, it is known gone at once on its own host (serving/processes.py)
    }


def answers_on_this_host(beats: list[dict], *, name: str) -> int:
    """The answers the other live workers of this worker's host run ("host:pid" names), as their heartbeats say (a
    killed one's last heartbeat says nothing)."""
    host = name.rpartition(":")[0]
    return sum(int(beat.get("active", 0)) for beat in beats
               if beat.get("name") != name and str(beat.get("name", "")).rpartition(":")[0] == host
               and not process_gone(beat.get("process")))


def lone_answers_k() -> dict[str, int | None]:
    """{slug: the K an answer alone that leaves K to the pair is planned with here now (0: the main alone; None: the
    draft goes on while confident)} for the pairs this worker serves: the chat shows it before a question is sent, so
    the web side never plans. Empty while the database is away (the heartbeat goes on)."""
    try:
        pairs = ModelPair.objects.filter(enabled=True, slug__in=[queue.removeprefix("pair.") for queue in _queues])
        lone = {pair.slug: planning.plan(pair=pair, asked=planning.Asked(), load=planning.Load(streams=1),
                                         calibration=host_figures(pair=pair)) for pair in pairs}
    except DatabaseError:
        return {}
    return {slug: 0 if planned.route.is_main_alone() else planned.k for slug, planned in lone.items()}


def _beat_forever() -> None:
    """The heartbeat, on a thread of its own: a slow or absent database never makes it late (the web side routes
    nothing to a worker whose heartbeat is late: routing.takes_turns)."""
    client = transport.sync_client()
    while not _stop.is_set():
        try:
            announce_worker(client=client, name=WORKER_NAME, payload=heartbeat_payload(),
                            ttl_s=settings.WORKER_HEARTBEAT_TTL_S)
            publish_held_blocks(client=client)
            STATE.engines.note_answers_elsewhere(answers_on_this_host(transport.live_workers(client=client),
                                                                      name=WORKER_NAME))
        except Exception:
            log.exception("heartbeat failed")
        _stop.wait(settings.WORKER_HEARTBEAT_S)


def _housekeep_forever() -> None:
    """What every live worker checks as often as it beats: other workers' orphaned and stuck answers, its own
    engines, the plan the heartbeat shows."""
    client = transport.sync_client()
    while not _stop.is_set():
        try:
            STATE.lone_k = lone_answers_k()
            fail_orphaned_generations(client=client)
            reroute_from_gone_workers(client=client)
            fail_unservable_generations(client=client)
            reconcile_claimed_generations(worker_name=WORKER_NAME)
            stop_unwatched_chat_answers(client=client)
            fail_abandoned_imports()
            jobs.fail_abandoned(model=BenchmarkRun)
            jobs.fail_abandoned(model=HostCalibration)
            if STATE.engines.active_requests() < settings.WORKER_SLOTS:
                resend_lost_generations(client=client, queues=list(_queues))
            _load_unloaded_pairs()
            STATE.engines.release_idle_extras()
        except Exception:
            log.exception("housekeeping failed")
        finally:
            close_old_connections()
        _stop.wait(settings.WORKER_HEARTBEAT_S)


def _listen() -> None:
    """Stops reach the running request at once (pub/sub), not at the next flush; the admin's load and
    unload reach every worker the same way."""
    while not _stop.is_set():
        try:
            client = transport.sync_client()
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(transport.CANCEL_CHANNEL, transport.control_channel(client))
            for message in pubsub.listen():
                if message["channel"] == transport.CANCEL_CHANNEL:
                    stop_running(generation_id=message["data"])
                else:
                    _control(json.loads(message["data"]))
        except Exception:
            log.exception("listener failed; reconnecting")
            _stop.wait(1)


def _control(message: dict) -> None:
    slug, queue = message["slug"], f"pair.{message['slug']}"
    if message["command"] == "load":  # consume the pair's queue from now on and load it, no restart
        _consume(queue)
        if queue not in _queues:
            _queues.append(queue)
        _loading.add(slug)
        threading.Thread(target=_load, args=(slug,), name=f"load-{slug}", daemon=True).start()
    elif message["command"] == "unload":  # stop taking the pair's requests and free it once idle
        for consumed in (queue, routing.worker_queue(pair_queue=queue, worker=WORKER_NAME)):
            _consumer[0].call_soon(_consumer[0].cancel_task_queue, consumed)
        if queue in _queues:
            _queues.remove(queue)
        STATE.engines.unload(slug)


def _consume(queue: str) -> None:
    """Take the pair's tasks from its shared queue and from this worker's own, where the router sends the turns whose
    blocks it holds (serving/routing.py)."""
    for consumed in (queue, routing.worker_queue(pair_queue=queue, worker=WORKER_NAME)):
        _consumer[0].call_soon(_consumer[0].add_task_queue, consumed)


def _load(slug: str) -> None:
    try:
        pair = ModelPair.objects.filter(slug=slug, enabled=True).first()
        if pair is not None:
            load_engine(pair=pair, route=pair_default_route(pair))
            calibrated.calibrate_if_missing(pair=pair, host=this_host(pair.runs_on))
    except Exception:
        log.exception("pair %s failed to load", slug)
    finally:
        _loading.discard(slug)
        close_old_connections()


def _load_unloaded_pairs() -> None:
    """Start loading, in the background, each pair of this worker's queues it holds no state for:
    at start, and when a pair is registered after the worker started (it would say LOADING until
    its first request otherwise). A pair that failed keeps its error until the admin loads it again."""
    for queue in list(_queues):
        slug = queue.removeprefix("pair.")
        if queue.startswith("pair.") and slug not in STATE.engines.states and slug not in _loading:
            _loading.add(slug)
            threading.Thread(target=_load, args=(slug,), name=f"load-{slug}", daemon=True).start()


def start_worker_services(sender, **_) -> None:
    _consumer[:] = [sender]
    _queues[:] = sorted(q.name for q in sender.task_consumer.queues)
    for queue in _queues:
        if queue.startswith("pair."):
            _consume(queue)
    _stop.clear()
    STATE.lone_k = lone_answers_k()  # in the first heartbeat already
    threading.Thread(target=_beat_forever, name="heartbeat", daemon=True).start()
    threading.Thread(target=_housekeep_forever, name="housekeeping", daemon=True).start()
    threading.Thread(target=_listen, name="listener", daemon=True).start()


def hand_back_on_stop(**_) -> None:
    """SIGTERM (a service stopped, a container scaled down): the answers running here finish, nothing new is routed
    here, and a task taken from now on goes back to the shared queue (worker.run_generation)."""
    STATE.stopping = True
    try:
        announce_worker(client=transport.sync_client(), name=WORKER_NAME, payload=heartbeat_payload(),
                        ttl_s=settings.WORKER_HEARTBEAT_TTL_S)
    except Exception:
        log.exception("could not say this worker is stopping")


def stop_worker_services(**_) -> None:
    _stop.set()
    try:
        client = transport.sync_client()
        retire_worker(client=client, name=WORKER_NAME)
        client.delete(*[transport.held_blocks_key(worker=WORKER_NAME, slug=queue.removeprefix("pair."))
                        for queue in _queues])
    except Exception:
        log.exception("could not remove the heartbeat")


def register() -> None:
    """Called as a worker starts (chatsite/celery.py): its start and stop hooks."""
    worker_ready.connect(start_worker_services)
    worker_shutting_down.connect(hand_back_on_stop)
    worker_shutdown.connect(stop_worker_services)
