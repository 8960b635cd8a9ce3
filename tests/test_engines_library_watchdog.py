"""A step process that hangs but stays alive (stopped with SIGSTOP, as a stuck kernel or a swapped-out
machine would leave it) no longer holds its answers and their slots forever: the worker's watchdog fails
them with a clear error within its budget, and the next request loads the engine again. A real worker,
real Redis, the demo models."""

import os
import signal
import time
from pathlib import Path

import pytest

from inference import transport
from inference.benchmark.memory import process_tree
from inference.models import Generation, ModelPair
from inference.serving import web
from tests.conftest import Worker, wait_until_done

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_agnostic]
STEP_TIMEOUT_S = 3


def pair_on_a_worker_of_its_own(demo_pair, stack_env, redis_client, tmp_path, *, slug: str, env: dict, **fields):
    """The demo pair under another slug (with these fields), served by a worker of its own with these settings."""
    pair = ModelPair.objects.create(name=slug, slug=slug, main_dir=demo_pair.main_dir, draft_dir=demo_pair.draft_dir,
                                    num_assistant_tokens=demo_pair.num_assistant_tokens, max_new_tokens_cap=4000,
                                    **fields)
    worker = Worker({**stack_env, **env}, pair.queue, tmp_path / "worker.log")
    try:
        worker.wait_ready(redis_client)
        yield pair, worker
    finally:
        worker.stop()


@pytest.fixture
def pair_on_a_watched_worker(demo_pair, stack_env, redis_client, tmp_path):
    yield from pair_on_a_worker_of_its_own(demo_pair, stack_env, redis_client, tmp_path, slug="watched",
                                           env={"SPECCHAT_STEP_TIMEOUT_S": str(STEP_TIMEOUT_S)})


def start(pair, max_tokens: int) -> Generation:
    options = web.parse_options({"max_tokens": max_tokens, "speculative": False, "ignore_eos": True})
    return web.start_generation(pair=pair, prompt="def parse(text):", options=options, source=Generation.Source.API)


def step_processes(worker: Worker) -> list[int]:
    return [pid for pid in process_tree(worker.proc.pid)[1:]
            if b"inference.engines.library.pipeline" in Path(f"/proc/{pid}/cmdline").read_bytes()]


def test_a_hung_step_process_fails_its_answer_in_bounded_time_and_is_reloaded(pair_on_a_watched_worker):
    pair, worker = pair_on_a_watched_worker
    generation = start(pair, max_tokens=4000)
    deadline = time.monotonic() + 60
    while not transport.sync_client().xlen(transport.stream_key(generation.id)) > 1 or not step_processes(worker):
        assert time.monotonic() < deadline, "the answer never started"
        time.sleep(0.1)
    hung = step_processes(worker)  # the main alone's, and the speculative one loaded as the worker started
    for pid in hung:
        os.kill(pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        failed = wait_until_done(generation.id)
    finally:
        for pid in hung:
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGCONT)  # the idle one: nothing waited on it, so nothing killed it
    took = time.monotonic() - stopped_at
    assert failed.status == Generation.Status.FAILED, failed.status
    assert "no step" in failed.error and "restarted" in failed.error, failed.error
    assert took < STEP_TIMEOUT_S * 3 + 10, took  # the budget (one prompt of a few tokens adds little), then a kill
    print(f"\nfailed {took:.1f} s after its step process hung: {failed.error}")

    again = wait_until_done(start(pair, max_tokens=16).id)  # the engine is loaded afresh
    assert again.status == Generation.Status.FINISHED and again.completion_tokens == 16
    assert len(set(hung) - set(step_processes(worker))) == 1  # the stalled one was killed, the idle one kept


MAX_ANSWER_S = 3


@pytest.fixture
def pair_on_a_time_limited_worker(large_demo_pair, stack_env, redis_client, tmp_path):
    """No step watchdog here: the answer's own time limit is what ends it. The large main: the small one
    writes all the tokens its context leaves (about 1,000) in under the limit on a fast host."""
    yield from pair_on_a_worker_of_its_own(large_demo_pair, stack_env, redis_client, tmp_path, slug="limited", env={
        "SPECCHAT_MAX_ANSWER_S": str(MAX_ANSWER_S), "SPECCHAT_STEP_TIMEOUT_S": "0"})


def test_an_answer_past_the_time_limit_is_stopped_with_its_text_kept_even_when_its_engine_hangs(
        pair_on_a_time_limited_worker):
    pair, worker = pair_on_a_time_limited_worker
    overran = wait_until_done(start(pair, max_tokens=4000).id)  # ~10 s of tokens here
    assert overran.status == Generation.Status.FAILED and f"limit of {MAX_ANSWER_S} s" in overran.error
    assert overran.text and 0 < overran.completion_tokens < 4000

    generation = start(pair, max_tokens=4000)
    deadline = time.monotonic() + 60
    while not transport.sync_client().xlen(transport.stream_key(generation.id)) > 1:
        assert time.monotonic() < deadline, "the answer never started"
        time.sleep(0.1)
    hung = step_processes(worker)
    for pid in hung:
        os.kill(pid, signal.SIGSTOP)  # it cannot even take the stop
    try:
        failed = wait_until_done(generation.id)
    finally:
        for pid in hung:
            os.kill(pid, signal.SIGCONT)
    assert failed.status == Generation.Status.FAILED and f"limit of {MAX_ANSWER_S} s" in failed.error, failed.error
    again = wait_until_done(start(pair, max_tokens=16).id)  # the slot is free and the engine goes on
    assert again.status == Generation.Status.FINISHED and again.completion_tokens == 16
