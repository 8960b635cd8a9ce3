"""An answer's final write meets a database that does not answer (SQLite locked by another process,
as a long transaction or a PostgreSQL restart would): it is retried on fresh connections, and if the
database stays away, the answer's readers still get an end. A real worker, real Redis, a real lock."""

import json
import os
import sqlite3
import time
from contextlib import contextmanager

import pytest
from django.conf import settings

from inference import transport
from inference.models import Generation, ModelPair
from inference.serving import web
from inference.serving.records import NOT_SAVED
from tests.conftest import Worker, wait_until_done

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"),
                       reason="the fault is an SQLite write lock"),
]
RETRY_S = 5


@pytest.fixture
def pair_on_a_private_worker(demo_pair, stack_env, redis_client, tmp_path):
    """The demo models as a pair of their own, on a worker whose SQLite waits 1 s for a lock (5 s as
    served) and retries the final write for RETRY_S."""
    pair = ModelPair.objects.create(name="Final write", slug="final-write", main_dir=demo_pair.main_dir,
                                    draft_dir=demo_pair.draft_dir, num_assistant_tokens=demo_pair.num_assistant_tokens)
    worker = Worker({**stack_env, "SPECCHAT_TEST_DB_TIMEOUT_S": "1", "SPECCHAT_FINAL_WRITE_RETRY_S": str(RETRY_S)},
                    pair.queue, tmp_path / "worker.log")
    try:
        worker.wait_ready(redis_client)
        yield pair
    finally:
        worker.stop()


def start(pair) -> Generation:
    options = web.parse_options({"max_tokens": 200, "speculative": False, "ignore_eos": True})
    return web.start_generation(pair=pair, prompt="def parse(text):", options=options,
                                source=Generation.Source.API)


def events(generation) -> list[dict]:
    return [json.loads(fields["data"])
            for _, fields in transport.sync_client().xrange(transport.stream_key(generation.id))]


def wait_for(condition, *, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return value


@contextmanager
def database_locked():
    """The database's write lock held by another process's connection, as a long write would hold it."""
    db = sqlite3.connect(settings.DATABASES["default"]["NAME"], isolation_level=None, timeout=30)
    db.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        db.execute("ROLLBACK")
        db.close()


def test_a_final_write_meeting_a_locked_database_is_retried(pair_on_a_private_worker):
    generation = start(pair_on_a_private_worker)
    wait_for(lambda: any(e["type"] == "delta" for e in events(generation)), timeout=60, what="no first delta")
    with database_locked():
        time.sleep(3)  # the answer ends meanwhile (200 tokens in about a second), its final write waits
        assert events(generation)[-1]["type"] != "done"
    ended = wait_until_done(generation.id)
    assert ended.status == Generation.Status.FINISHED and ended.completion_tokens == 200
    # The record is written before the stream's end is sent: on a loaded host the end comes a moment later.
    wait_for(lambda: events(generation)[-1]["type"] == "done", timeout=10, what="the stream got no end")


def test_a_database_away_longer_than_the_retries_still_ends_the_stream(pair_on_a_private_worker):
    generation = start(pair_on_a_private_worker)
    wait_for(lambda: any(e["type"] == "delta" for e in events(generation)), timeout=60, what="no first delta")
    with database_locked():
        locked_at = time.monotonic()
        last = wait_for(lambda: (e := events(generation)) and e[-1]["type"] in ("done", "error") and e[-1],
                        timeout=RETRY_S + 20, what="the stream got no end while the database was locked")
        assert last == {"type": "error", "message": NOT_SAVED}
        assert time.monotonic() - locked_at < RETRY_S + 10
    assert "/" not in last["message"]  # nothing of the worker's files or exception text
    worker_log = "".join(path.read_text() for path in _worker_logs())
    assert "could not be written" in worker_log  # the details are in the worker's log
    # Once the database answers again, the worker's heartbeat ends the record its threads no longer hold.
    ended = wait_until_done(generation.id)
    assert (ended.status, ended.error) == (Generation.Status.FAILED, NOT_SAVED)


def _worker_logs():
    return [w.log_path for w in Worker.started if os.path.exists(w.log_path)]
