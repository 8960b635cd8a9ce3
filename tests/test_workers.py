"""Workers announce themselves; the admin loads and unloads a pair on them without a restart."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict

import pytest
from django.conf import settings
from django.utils import timezone

from inference import selectors, transport
from inference.engines.decoding import DecodingParams
from inference.limits import Route
from inference.models import Generation, ModelPair
from inference.serving import readers, web
from inference.tasks import generate
from tests.conftest import wait_until_done

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker")]


def wait_for_state(pair: ModelPair, wanted: str, timeout: float = 60) -> selectors.PairState:
    deadline = time.time() + timeout
    while True:
        state = selectors.pair_state(pair=pair, workers=selectors.live_workers(client=transport.sync_client()))
        if state.state == wanted or time.time() > deadline:
            return state
        time.sleep(0.5)


def test_heartbeat_shows_the_worker_and_its_queues(celery_worker, redis_client):
    beats = selectors.live_workers(client=redis_client)
    mine = next(b for b in beats if b["name"] == celery_worker.name)
    assert "pair.demo-code" in mine["queues"] and mine["slots"] > 0


def test_the_containers_health_check_sees_this_hosts_worker(celery_worker, stack_env):
    check = [sys.executable, "-m", "inference.worker_health"]
    assert subprocess.run(check, check=False, env=stack_env, cwd=settings.BASE_DIR).returncode == 0
    server, db = stack_env["REDIS_URL"].rsplit("/", 1)
    empty = {**stack_env, "REDIS_URL": f"{server}/{(int(db) + 1) % 16}"}  # a database this run's worker does not use
    failed = subprocess.run(check, check=False, env=empty, cwd=settings.BASE_DIR, capture_output=True, text=True)
    assert failed.returncode == 1 and "heartbeat" in failed.stderr


def test_admin_loads_and_unloads_a_pair_without_restart(admin_client, demo_pair):
    pair = ModelPair.objects.create(name="Hot", slug="hot", main_dir=demo_pair.main_dir,
                                    draft_dir=demo_pair.draft_dir, num_assistant_tokens=3)
    assert wait_for_state(pair, "UNAVAILABLE", timeout=1).error == "no live worker serves queue pair.hot"
    page = admin_client.post("/admin/inference/modelpair/", {"action": "load_on_worker", "_selected_action": [pair.id]},
                             follow=True).content.decode()
    assert "1 worker(s) received it" in page
    assert wait_for_state(pair, "AVAILABLE").state == "AVAILABLE"
    listing = admin_client.get("/admin/inference/modelpair/").content.decode()
    assert "available on 1 worker" in listing
    admin_client.post("/admin/inference/modelpair/", {"action": "unload_from_worker", "_selected_action": [pair.id]})
    assert wait_for_state(pair, "UNAVAILABLE").state == "UNAVAILABLE"


def test_a_request_the_pipeline_refuses_ends_in_an_error_and_the_worker_goes_on(demo_pair, redis_client):
    """A record the web side would now refuse (written by an older version, say): the pipeline raises
    on the worker; the reader must get an error event, not wait forever."""
    refused = Generation.objects.create(pair=demo_pair, prompt="def f(x):", prompt_tokens=4, params={
        "decoding": asdict(DecodingParams(max_new_tokens=8, temperature=5e-324)), "speculative": True})
    generate.apply_async(args=[str(refused.id)], queue=demo_pair.queue)
    last, after, deadline = {}, "0-0", time.time() + 60
    while last.get("type") not in transport.TERMINAL and time.time() < deadline:
        for _, entries in redis_client.xread({transport.stream_key(refused.id): after}, block=1000):
            after, last = entries[-1][0], json.loads(entries[-1][1]["data"])
    assert last["type"] == "error" and "temperature" in last["message"]
    refused.refresh_from_db()
    assert refused.status == Generation.Status.FAILED and "temperature" in refused.error

    served = wait_until_done(web.start_generation(
        pair=demo_pair, prompt="def f(x):", options=web.GenerationOptions(max_new_tokens=8)).id)
    assert served.status == Generation.Status.FINISHED and served.completion_tokens == 8


def test_a_dead_workers_unread_generation_is_failed_by_the_live_ones(demo_pair, stack_env, redis_client, tmp_path):
    """A background API request nobody follows: when its worker dies, the session's live worker
    marks it failed (its heartbeat expired), so a later poll does not find it 'running' forever."""
    from tests.conftest import Worker

    doomed = ModelPair.objects.create(name="Doomed", slug="doomed", main_dir=demo_pair.main_dir,
                                      draft_dir=demo_pair.draft_dir, num_assistant_tokens=3)
    env = {**stack_env, "SPECCHAT_WORKER_HEARTBEAT_S": "1", "SPECCHAT_WORKER_HEARTBEAT_TTL_S": "3"}
    worker = Worker(env, doomed.queue, tmp_path / "doomed.log")
    try:
        worker.wait_ready(redis_client)
        generation = web.start_generation(pair=doomed, prompt="def f(x):",
                                               options=web.GenerationOptions(max_new_tokens=500))
        deadline = time.time() + 60
        while not redis_client.xlen(transport.stream_key(generation.id)) >= 2 and time.time() < deadline:
            time.sleep(0.05)  # the start event and a first delta: it is running
        worker.proc.kill()
        generation = wait_until_done(generation.id)  # nobody reads it: the live worker's sweep ends it
        assert generation.status == Generation.Status.FAILED and "stopped before it finished" in generation.error
    finally:
        worker.stop()


def test_a_pair_registered_after_the_worker_started_is_loaded_without_a_request(demo_pair):
    """The worker already consumes pair.demo-plain; registering the pair is enough for it to load
    (a plain pair, main alone: its state is shown too) and to answer."""
    plain = ModelPair.objects.create(name="Plain", slug="demo-plain", main_dir=demo_pair.main_dir)
    assert wait_for_state(plain, "AVAILABLE").state == "AVAILABLE"
    generation = wait_until_done(web.start_generation(
        pair=plain, prompt="def f(x):", options=web.GenerationOptions(max_new_tokens=8)).id)
    assert generation.status == Generation.Status.FINISHED and generation.draft_tokens is None


def test_a_queued_generation_whose_task_was_lost_is_sent_again(demo_pair):
    """The record was written but its Celery message never reached a worker (Redis without persistence
    restarted, a worker died after prefetching it): a worker with a free slot sends it again."""
    lost = Generation.objects.create(pair=demo_pair, prompt="def f(x):", prompt_tokens=4, params={
        "decoding": asdict(DecodingParams(max_new_tokens=8)), "speculative": True})  # no task sent
    generation = wait_until_done(lost.id)
    assert generation.status == Generation.Status.FINISHED and generation.completion_tokens == 8


def test_a_worker_taken_for_dead_does_not_finish_what_was_failed(demo_pair, stack_env, redis_client, tmp_path):
    """A worker frozen past its heartbeat's expiry (SIGSTOP) is taken for dead and its answer failed;
    when it wakes it stops that answer and writes no `done` after the error, nor over the record."""
    from tests.conftest import Worker

    frozen = ModelPair.objects.create(name="Frozen", slug="frozen", main_dir=demo_pair.main_dir,
                                      draft_dir=demo_pair.draft_dir, num_assistant_tokens=3)
    env = {**stack_env, "SPECCHAT_WORKER_HEARTBEAT_S": "1", "SPECCHAT_WORKER_HEARTBEAT_TTL_S": "3"}
    worker = Worker(env, frozen.queue, tmp_path / "frozen.log")
    try:
        worker.wait_ready(redis_client)
        generation = web.start_generation(pair=frozen, prompt="def f(x):",
                                          options=web.GenerationOptions(max_new_tokens=500, ignore_eos=True))
        key = transport.stream_key(generation.id)
        deadline = time.time() + 60
        while not redis_client.xlen(key) >= 2 and time.time() < deadline:
            time.sleep(0.05)
        os.kill(worker.proc.pid, signal.SIGSTOP)
        failed = wait_until_done(generation.id)  # the session's live worker sweeps it
        assert failed.status == Generation.Status.FAILED
        os.kill(worker.proc.pid, signal.SIGCONT)
        time.sleep(4)  # it wakes, sees the cancel, stops the request and reaches its final write
        generation.refresh_from_db()
        assert generation.status == Generation.Status.FAILED and generation.error == failed.error
        events = [json.loads(fields["data"])["type"] for _, fields in redis_client.xrange(key)]
        assert "error" in events and "done" not in events[events.index("error"):]
    finally:
        os.kill(worker.proc.pid, signal.SIGCONT)
        worker.stop()


def test_an_edited_pair_frees_the_engine_it_replaces(demo_pair, celery_worker, redis_client):
    """Each edit of a pair's settings builds a new pipeline; the worker keeps one per role
    (the library's speculative pipeline, its main alone, its own engine), not one per edit."""
    for cache_size_gb in (2, 3, 1):
        demo_pair.cache_size_gb = cache_size_gb
        demo_pair.save()
        for speculative in (True, False):
            wait_until_done(web.start_generation(pair=demo_pair, prompt="def f(x):", options=web.GenerationOptions(
                max_new_tokens=4, speculative=speculative)).id)
    time.sleep(3)  # a heartbeat
    beat = next(w for w in selectors.live_workers(client=redis_client) if w["name"] == celery_worker.name)
    routes = [e["route"] for e in beat["engines"] if e["slug"] == "demo-code"]
    assert len(routes) == len(set(routes)) and {Route.LIBRARY_SPECULATIVE, Route.LIBRARY_MAIN_ALONE} <= set(routes)


def test_a_reader_waits_for_the_end_event_that_lags_the_record(demo_pair, redis_client):
    """The worker ends the record a moment before it appends `done`: a reader that sees the record
    but not the event must keep reading (16 streams under load lost their usage this way)."""
    generation = Generation.objects.create(pair=demo_pair, prompt="p", status=Generation.Status.RUNNING)
    writer = transport.StreamWriter(redis_client, generation.id)
    delta = writer.send({"type": "delta", "steps": [["", "x"]]})
    Generation.objects.filter(id=generation.id).update(status=Generation.Status.FINISHED, finished_at=timezone.now())
    assert not readers.nothing_after(generation_id=generation.id, seen=delta)
    done = writer.send({"type": "done", "finish_reason": "stop"})
    assert not readers.nothing_after(generation_id=generation.id, seen=delta)
    assert readers.nothing_after(generation_id=generation.id, seen=done)
    assert readers.nothing_after(generation_id=generation.id, seen="99999999999999-0")
