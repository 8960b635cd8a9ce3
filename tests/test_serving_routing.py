"""Two real Celery workers of one pair: a conversation's turns go to the worker that holds its blocks, and a worker
stopped between two turns (SIGTERM, as systemd stops a service) hands the next one to the other, lost nowhere."""

import os
import re
import signal
import time

import pytest

from inference import metrics, transport
from inference.admin.pairs import worker_words
from inference.models import Generation, ModelPair
from inference.serving import web
from inference.serving.processes import process_gone
from inference.serving.routing import RoutedBy
from tests.conftest import Worker, wait_until_done

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker")]

PASTE = "\n".join(f"def step_{i}(values, limit={i}):\n    return [v * {i} for v in values if v < limit]\n"
                  for i in range(24))


@pytest.fixture
def two_workers(demo_pair, stack_env, redis_client, tmp_path):
    """A pair on the own engine (which keeps blocks across turns) that only these two workers serve."""
    yield from _two_workers(demo_pair, stack_env, redis_client, tmp_path, heartbeat_ttl_s=3)


@pytest.fixture
def two_workers_slow_to_expire(demo_pair, stack_env, redis_client, tmp_path):
    """The same, their heartbeats living 30 s: well past the web side's SPECCHAT_ROUTE_BEAT_LATE_S (6 s)."""
    yield from _two_workers(demo_pair, stack_env, redis_client, tmp_path, heartbeat_ttl_s=30)


@pytest.fixture
def two_workers_never_late(demo_pair, stack_env, redis_client, tmp_path):
    """The same, a silent heartbeat never late: as a worker on another host looks until its heartbeat expires."""
    yield from _two_workers(demo_pair, stack_env, redis_client, tmp_path, heartbeat_ttl_s=30, beat_late_s=60)


def _two_workers(demo_pair, stack_env, redis_client, tmp_path, *, heartbeat_ttl_s: int, beat_late_s: int = 6):
    pair = ModelPair.objects.create(name="Routed", slug="routed", main_dir=demo_pair.main_dir,
                                    draft_dir=demo_pair.draft_dir, num_assistant_tokens=3, own_engine_streams=4)
    env = {**stack_env, "SPECCHAT_WORKER_HEARTBEAT_S": "1", "SPECCHAT_WORKER_HEARTBEAT_TTL_S": str(heartbeat_ttl_s),
           "SPECCHAT_ROUTE_BEAT_LATE_S": str(beat_late_s)}
    workers = [Worker(env, pair.queue, tmp_path / f"routed-{n}.log") for n in range(2)]
    try:
        names = [worker.wait_ready(redis_client) for worker in workers]
        deadline = time.time() + 120
        while time.time() < deadline and not all(_block_tokens(redis_client, name) for name in names):
            time.sleep(0.5)  # each has loaded the pair's own engine and says how it hashes a prompt
        yield pair, dict(zip(names, workers, strict=True))
    finally:
        for worker in workers:
            worker.stop()


def _block_tokens(client, name: str) -> int:
    beat = next((b for b in transport.live_workers(client=client) if b["name"] == name), {})
    return beat.get("kv_block_tokens", {}).get("routed", 0)


def _log_tails(workers) -> str:
    return "\n".join(worker.log_path.read_text()[-4000:] for worker in workers)


def _turn(pair, user, prompt: str) -> Generation:
    generation = web.start_generation(pair=pair, prompt=prompt, user=user,
                                      options=web.GenerationOptions(max_new_tokens=24))
    return wait_until_done(generation.id)


def _until_dead(name: str) -> None:
    """Until the worker's process is seen gone, as the web side sees it (within 10 s)."""
    [beat] = [beat for beat in transport.live_workers(client=transport.sync_client()) if beat["name"] == name]
    deadline = time.time() + 10
    while not process_gone(beat.get("process")) and time.time() < deadline:
        time.sleep(0.01)


def test_follow_ups_go_to_the_worker_holding_the_conversation_and_survive_its_stop(two_workers, user, admin_client,
                                                                                   redis_client):
    pair, workers = two_workers
    prompt = PASTE + "\n# Question 1: which step keeps the most values?\n"
    first = _turn(pair, user, prompt)
    assert first.status == Generation.Status.FINISHED and first.routed_to == first.worker

    holder = first.worker
    for question in range(2, 5):
        prompt += first.text + f"\n# Question {question}: and the fewest?\n"
        follow_up = _turn(pair, user, prompt)
        assert follow_up.status == Generation.Status.FINISHED, follow_up.error
        assert follow_up.worker == holder and follow_up.params["routed"]["by"] == RoutedBy.CACHE
        assert follow_up.cached_tokens >= 0.9 * follow_up.prompt_tokens  # read from the cache, not again
        first = follow_up

    # Said where an operator looks: the pair's page lists both workers and what the holder keeps; /metrics counts.
    page = admin_client.get(f"/admin/inference/modelpair/{pair.pk}/change/").content.decode()
    other = next(name for name in workers if name != holder)
    cells = {row[0]: row for row in re.findall(r"<tr><td>([^<]+)</td>" + r"<td>([^<]*)</td>" * 5, page)}
    kept, other_kept = (int(cells[worker_words(name)][4].replace(",", "")) for name in (holder, other))
    assert kept >= follow_up.prompt_tokens - 64 and other_kept < kept  # the whole conversation, but its last blocks
    exposition = metrics.exposition(client=redis_client)
    assert 'specchat_routed_requests_total{model_name="routed",by="cache"} 3' in exposition
    assert f'specchat_worker_cached_prompt_tokens_total{{model_name="routed",worker="{holder}"}}' in exposition

    # The holder is asked to stop, as systemd stops a service; the next turn is sent at once.
    os.kill(workers[holder].proc.pid, signal.SIGTERM)
    prompt += first.text + "\n# Question 5: rename step_3.\n"
    after = _turn(pair, user, prompt)
    # It came twice to the other worker (the holder's hand-back, the web's re-route): the second delivery once ended
    # by dropping the first's claim, and the answer was failed as not saved (tests/test_serving_worker.py).
    assert after.status == Generation.Status.FINISHED, (after.error, _log_tails(workers.values()))
    assert after.worker != holder and after.completion_tokens == 24
    workers[holder].proc.wait(30)


def test_a_worker_killed_between_two_turns_gets_no_follow_up_sent_at_once(two_workers_slow_to_expire, user):
    """SIGKILL (the OOM killer, `kill -9`): the worker beats no more, and its heartbeat lives on until it expires (30 s
    here) and looks fresh until it is late (6 s). The next turn, sent at once, goes straight to the live worker, read
    cold there, not to the dead holder's queue to wait: its process is seen gone on this host."""
    pair, workers = two_workers_slow_to_expire
    prompt = PASTE + "\n# Question 1: which step keeps the most values?\n"
    first = _turn(pair, user, prompt)
    holder = first.worker
    os.kill(workers[holder].proc.pid, signal.SIGKILL)  # not waited for: a zombie until the next turn has ended
    _until_dead(holder)  # the kill takes effect once the kernel runs the process again: on a busy host, not at once
    after = _turn(pair, user, prompt + first.text + "\n# Question 2: and the fewest?\n")
    assert holder in {beat["name"] for beat in transport.live_workers(client=transport.sync_client())}  # not expired
    assert after.status == Generation.Status.FINISHED, (after.error, _log_tails(workers.values()))
    assert after.routed_to == after.worker != holder and after.completion_tokens == 24
    assert after.params["routed"]["by"] == RoutedBy.LOAD
    workers[holder].proc.wait(30)


def test_a_turn_its_hung_holder_leaves_unclaimed_goes_to_another_worker_within_seconds(two_workers_never_late, user):
    """SIGSTOP: a hung worker, or one killed on another host, whose process this host cannot see. Its heartbeat looks
    fresh and its process is there, so the next turn is routed to it by its cache, and nobody claims it. The live
    worker sends it to the shared queue once it has waited SPECCHAT_ROUTE_UNCLAIMED_S (2 s), not when the holder's
    heartbeat expires (30 s here)."""
    pair, workers = two_workers_never_late
    prompt = PASTE + "\n# Question 1: which step keeps the most values?\n"
    first = _turn(pair, user, prompt)
    holder = first.worker
    os.kill(workers[holder].proc.pid, signal.SIGSTOP)
    try:
        after = _turn(pair, user, prompt + first.text + "\n# Question 2: and the fewest?\n")
    finally:
        os.kill(workers[holder].proc.pid, signal.SIGCONT)  # it wakes to a turn already served: its claim fails
    assert after.status == Generation.Status.FINISHED, (after.error, _log_tails(workers.values()))
    assert after.params["routed"]["by"] == RoutedBy.CACHE and after.worker != holder
    assert after.routed_to == ""  # taken back from the holder's queue: sent to the shared one
    assert (after.started_at - after.created_at).total_seconds() < 10, _log_tails(workers.values())
    assert after.completion_tokens == 24
