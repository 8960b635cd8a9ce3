"""Background API requests nobody follows reach an end state in bounded time and free their slot: one whose
pair lost its only worker after it was accepted, and ones whose engine hangs before it takes them. Through the
live API, real workers, the demo models; faults as the other fault tests make them (a worker killed,
step processes stopped with SIGSTOP)."""

import contextlib
import json
import os
import signal
import time

import pytest
import requests

from inference.api.auth import set_new_key
from inference.models import ApiKey, Generation
from tests.api_client import PROMPT, post, sse_events
from tests.conftest import wait_until_done
from tests.test_engines_library_watchdog import pair_on_a_worker_of_its_own, step_processes
from tests.test_workers import wait_for_state

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker")]
MAX_ANSWER_S = 3


def key_secret(max_concurrent: int) -> str:
    key = ApiKey(name="background", max_concurrent=max_concurrent)
    secret = set_new_key(key)
    key.save()
    return secret


def start_in_background(base_url: str, key: str, body: dict) -> str:
    """A background request whose client leaves after a second, before any answer: nobody follows it."""
    known = set(Generation.objects.values_list("id", flat=True))
    with contextlib.suppress(requests.exceptions.ReadTimeout):
        post(base_url, "/v1/completions", key, {"prompt": PROMPT, "max_tokens": 8, **body, "background": True},
             timeout=(10, 1))
    deadline = time.monotonic() + 30
    while not (started := set(Generation.objects.values_list("id", flat=True)) - known):
        assert time.monotonic() < deadline, "the request was not recorded"
        time.sleep(0.1)
    return str(started.pop())


def error_seen_by_a_follower(base_url: str, key: str, generation_id: str) -> str:
    with requests.get(f"{base_url}/v1/completions/{generation_id}/events", stream=True, timeout=60,
                                    headers={"Authorization": f"Bearer {key}"}) as response:
        for _, data in sse_events(response):
            if data != "[DONE]" and "error" in (event := json.loads(data)):
                return event["error"]["message"]
    raise AssertionError("the stream ended without an error")


@pytest.fixture
def pair_on_a_short_lived_worker(demo_pair, stack_env, redis_client, tmp_path):
    yield from pair_on_a_worker_of_its_own(demo_pair, stack_env, redis_client, tmp_path, slug="short-lived", env={
        "SPECCHAT_WORKER_HEARTBEAT_S": "1", "SPECCHAT_WORKER_HEARTBEAT_TTL_S": "10"})


def test_a_background_request_whose_pair_lost_its_worker_fails_unfollowed(live_server_url,
                                                                          pair_on_a_short_lived_worker):
    """Accepted while the killed worker's heartbeat still stood; nobody consumes its queue any more. The
    session's live worker, serving other pairs, fails it with the reason, and its key's slot is free."""
    pair, worker = pair_on_a_short_lived_worker
    key = key_secret(max_concurrent=1)
    assert wait_for_state(pair, "AVAILABLE").state == "AVAILABLE"  # not loading: its answers are not judged slow
    worker.proc.kill()
    killed_at = time.monotonic()
    generation_id = start_in_background(live_server_url, key, {"model": pair.slug})
    failed = wait_until_done(generation_id)  # read from the database: nobody follows it
    took = time.monotonic() - killed_at
    assert failed.status == Generation.Status.FAILED, failed.status
    assert failed.error == f"No worker can serve '{pair.slug}': no live worker serves queue {pair.queue}.", failed.error
    assert took < 40, took  # the heartbeat's expiry (10 s here), then a live worker's next beat
    assert not Generation.objects.filter(status__in=[Generation.Status.QUEUED, Generation.Status.RUNNING]).exists()
    assert error_seen_by_a_follower(live_server_url, key, generation_id).endswith(failed.error)


@pytest.fixture
def pair_on_a_worker_without_watchdog(demo_pair, stack_env, redis_client, tmp_path):
    """The answers' own time limit is all that bounds them: no step watchdog kills a stopped step process."""
    yield from pair_on_a_worker_of_its_own(demo_pair, stack_env, redis_client, tmp_path, slug="hanging", env={
        "SPECCHAT_MAX_ANSWER_S": str(MAX_ANSWER_S), "SPECCHAT_STEP_TIMEOUT_S": "0"})


def test_answers_whose_engine_hangs_before_taking_them_end_within_the_time_limit(live_server_url,
                                                                                pair_on_a_worker_without_watchdog):
    """The step processes are stopped; each answer's 60 KB schema fills the socket to them until handing one
    over (engine.submit) blocks, and so do the stops of those handed over before. Every answer still ends,
    failed with the limit, nobody following it, and once the engine wakes the worker serves again."""
    pair, worker = pair_on_a_worker_without_watchdog
    key = key_secret(max_concurrent=8)
    body = {"model": pair.slug, "speculative": False}
    warm = start_in_background(live_server_url, key, body)  # loads the main alone's step process
    warmed = wait_until_done(warm)
    assert warmed.status == Generation.Status.FINISHED, warmed.error
    schema = {"type": "string", "maxLength": 8, "description": "x" * 60_000}  # compiles in milliseconds
    held = {**body, "response_format": {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}}
    stopped = step_processes(worker)
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        generation_ids = [start_in_background(live_server_url, key, held) for _ in range(6)]
        ended = [wait_until_done(generation_id) for generation_id in generation_ids]
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    errors = [generation.error for generation in ended]
    assert all(generation.status == Generation.Status.FAILED for generation in ended), errors
    assert all(f"limit of {MAX_ANSWER_S} s" in error for error in errors), errors
    assert any("did not take this answer" in error for error in errors), errors  # some hung in submit itself
    assert error_seen_by_a_follower(live_server_url, key, generation_ids[-1]).endswith(ended[-1].error)
    again = wait_until_done(start_in_background(live_server_url, key, body))  # slots free, the engine goes on
    assert again.status == Generation.Status.FINISHED, (again.error, errors)
