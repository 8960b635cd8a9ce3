"""Faults on a private stack (its own redis-server, two workers, daphne): a Redis restart mid-answer,
a worker killed mid-answer beside another, and the soak that mixes them with every kind of client."""

import asyncio
import json
import os
import signal
import time
from contextlib import contextmanager

import aiohttp
import pytest

from inference.benchmark import soak
from inference.benchmark.servers import private_stack, stack_credentials
from inference.models import Generation, ModelPair
from tests.conftest import Worker, wait_until_done

pytestmark = pytest.mark.django_db(transaction=True)  # run on SQLite and on PostgreSQL, as make test does


@pytest.fixture
def private(request, demo_pair, stack_env):
    """The demo pair's models as a pair of its own (the session's worker, on another Redis, serves
    demo-code), served by a stack of the test's own; engines renewed every 20 requests, so the soak
    also runs across pipeline renewals. Each worker has 8 threads, or `request.param`."""
    pair = ModelPair.objects.create(name="Faults", slug="faults", main_dir=demo_pair.main_dir,
                                    draft_dir=demo_pair.draft_dir, num_assistant_tokens=demo_pair.num_assistant_tokens)
    env = {**stack_env, "SPECCHAT_ENGINE_RENEW_AFTER_REQUESTS": "20"}
    with session_workers_paused(), stack_credentials(max_concurrent=10) as credentials, private_stack(
            pair=pair, base_env=env, chat_max_concurrent=10, threads=getattr(request, "param", 8)) as stack:
        yield stack, credentials


@contextmanager
def session_workers_paused():
    """The suite's own workers share the test database but beat on another Redis: they would take the
    private stack's workers for dead and fail their answers. They are frozen meanwhile."""
    paused = [w.proc.pid for w in Worker.started if w.proc.poll() is None]
    for pid in paused:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
        if paused:
            time.sleep(3)  # a heartbeat: they are seen alive again before the next test


async def _stream(stack, credentials, *, max_tokens: int, during=None) -> tuple[str, str, list[str]]:
    """An SSE completion read to its end; `during(chunks_so_far)` runs once, after the 5th chunk."""
    body = {"model": stack.pair.slug, "prompt": "def parse(text):", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True}
    text, errors = "", []
    async with aiohttp.ClientSession() as http, http.post(
            f"{stack.base_url}/v1/completions", json=body,
            headers={"Authorization": f"Bearer {credentials.api_key}"}) as resp:
        generation_id = resp.headers["X-Generation-Id"]
        chunks = 0
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("error"):
                errors.append(chunk["error"]["message"])
            text += "".join(c.get("text") or "" for c in chunk.get("choices") or [])
            chunks += 1
            if chunks == 5 and during:
                await asyncio.get_running_loop().run_in_executor(None, during)
    return generation_id, text, errors


def test_a_chat_answer_followed_across_a_redis_restart_is_not_taken_for_abandoned(large_demo_pair, stack_env):
    """Redis restarts under a chat answer older than the abandon grace: the page's marks of the answers it watches
    are gone until its next recheck, and the worker must not take that for a closed page and stop the answer."""
    pair = ModelPair.objects.create(name="Restart", slug="restart", main_dir=large_demo_pair.main_dir,
                                    draft_dir=large_demo_pair.draft_dir, max_new_tokens_cap=1500)
    with session_workers_paused(), stack_credentials(max_concurrent=2) as credentials, private_stack(
            pair=pair, base_env=stack_env, workers=1) as stack:
        events = asyncio.run(_chat_across_a_restart(stack, credentials))
    assert events[-1]["type"] == "done", events[-1]
    assert events[-1]["finish_reason"] in ("length", "stop", "repeating"), events[-1]  # its own end, not "stopped"


async def _chat_across_a_restart(stack, credentials) -> list[dict]:
    """A chat answer's events, Redis restarted once it has run past the abandon grace (5 s on the private stack)."""
    events: list[dict] = []
    restart = None
    async with aiohttp.ClientSession() as http, http.ws_connect(
            stack.base_url.replace("http", "ws", 1) + "/ws/chat/", origin=stack.base_url,
            headers={"Cookie": credentials.session_cookie}, timeout=aiohttp.ClientWSTimeout(ws_receive=60)) as ws:
        await ws.send_json({"action": "send", "pair": stack.pair.slug, "text": "def parse(text):",
                            "settings": {"max_tokens": 1500, "ignore_eos": True, "speculative": False,
                                         "temperature": 1.0, "seed": 7}})  # sampled: greedy looped, and was cut
        started = time.monotonic()
        while not events or events[-1]["type"] not in ("done", "error"):
            message = await ws.receive_json()
            assert message["type"] != "error", message
            events += [message["event"]] if message["type"] == "event" else []
            if restart is None and time.monotonic() - started > 7:
                restart = asyncio.get_running_loop().run_in_executor(None, stack.redis.restart)
    assert restart is not None, f"the answer ended within the grace: it proves nothing ({events[-1]})"
    await restart
    return events


def test_an_answer_streamed_across_a_redis_restart_loses_and_doubles_nothing(private):
    """Redis (no persistence) restarts while an answer streams: the stream is gone with every event
    in it; the worker writes it again, the reader goes on from where it was, and what it read is the
    stored answer, whole."""
    stack, credentials = private
    generation_id, text, errors = asyncio.run(_stream(stack, credentials, max_tokens=400,
                                                      during=stack.redis.restart))
    generation = wait_until_done(generation_id)
    assert not errors and generation.status == Generation.Status.FINISHED
    assert generation.completion_tokens == 400 and text == generation.text


@pytest.mark.parametrize("private", [3], indirect=True)
def test_two_workers_share_a_queue_and_a_killed_one_fails_only_its_own_answers(private):
    """Both workers take answers from the pair's queue; one is killed mid-answer: its answers fail
    within seconds, the other's finish, and new requests are served by the survivor. With 3 threads
    each, a burst of 6 must go to both (a worker reserves no more tasks than it has threads)."""
    stack, credentials = private

    async def burst(n: int, max_tokens: int):
        return await asyncio.gather(*(_stream(stack, credentials, max_tokens=max_tokens) for _ in range(n)))

    first = asyncio.run(burst(8, 24))
    served_by = {wait_until_done(gid).worker for gid, _, _ in first}
    assert len(served_by) == 2  # both took part

    victim = {}

    def kill_when_running():
        """Kill a worker that is writing one of the burst's answers (whichever the queue gave them to)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not victim:
            running = set(Generation.objects.filter(pair=stack.pair, status=Generation.Status.RUNNING)
                          .values_list("worker", flat=True))
            for index, proc in enumerate(stack.workers):
                if any(name.endswith(f":{proc.pid}") for name in running):
                    victim.update(index=index, pid=proc.pid)
                    break
            time.sleep(0.2)
        time.sleep(0.5)
        stack.kill_worker(victim["index"])
        return time.monotonic()

    async def burst_and_kill():
        killer = asyncio.get_running_loop().run_in_executor(None, kill_when_running)
        results = await burst(6, 400)
        return results, await killer

    results, killed_at = asyncio.run(burst_and_kill())
    ended_at = time.monotonic()
    rows = [wait_until_done(gid) for gid, _, _ in results]
    victim_name = next(w for w in {r.worker for r in rows} if w.endswith(f":{victim['pid']}"))
    for (_, text, errors), row in zip(results, rows, strict=True):
        if row.worker == victim_name:
            assert row.status == Generation.Status.FAILED and errors and "stopped before it finished" in errors[0]
        else:
            assert row.status == Generation.Status.FINISHED and not errors and text == row.text
    assert any(r.worker == victim_name for r in rows) and any(r.worker != victim_name for r in rows)
    assert ended_at - killed_at < 60  # the survivor's answers (400 tokens) bound this; the victim's failed in ~3 s
    after = asyncio.run(burst(2, 8))
    assert all(wait_until_done(gid).status == Generation.Status.FINISHED for gid, _, _ in after)


def test_soak_mixed_clients_through_a_worker_kill_a_database_outage_and_a_redis_restart(private):
    """The soak, briefly, a worker's step processes frozen for 5 s first and the database gone for 5 s:
    every generation ends, streamed texts equal stored ones, no 500, no phantom slot, memory back to its
    baseline; a failure reaches its client within seconds; a logged-out chat user's socket is closed."""
    stack, credentials = private
    options = soak.SoakOptions(generations=90, concurrency=(4, 8), max_tokens=(8, 32), seed=3, freeze_steps_s=5,
                               database_outage_s=5)
    figures = soak.run_soak(stack=stack, credentials=credentials, options=options)
    missed = [(name, measured) for name, met, measured in soak.verdicts(figures) if not met]
    if figures["unplanned_worker_exits"]:
        # Celery's Redis transport sometimes exits the worker when Redis goes away (kombu 5.7); the
        # stack starts it again as compose would, and the memory of a new process has no baseline.
        missed = [(name, measured) for name, measured in missed if not name.startswith("worker memory")]
    assert not missed, json.dumps([missed, figures], default=str)
    assert [f["fault"] for f in figures["faults"]] == ["freeze_steps", "kill_worker", "database_outage",
                                                       "restart_redis"]
    # Most texts are compared: not those of clients that left, nor of answers the faults failed (the
    # database outage refuses every request sent meanwhile: about 30 of the 90 on PostgreSQL).
    assert figures["compared_texts"] >= 45 and set(figures["by_kind"]) >= {
        "websocket/reconnect", "websocket/stop", "websocket/logout", "sse/plain", "background/plain", "blocking/plain"}
