"""The REST API's streams on real parts: resumed after a dropped connection, stopped by a
disconnect, cancelled, and held to each key's concurrency."""

import json

import openai
import pytest
import requests

from inference.models import ApiKey, Generation
from tests.api_client import PROMPT, chunk_text, client, post, sse_events
from tests.conftest import wait_until_done

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_agnostic]  # generation, not its record


@pytest.mark.usefixtures("celery_worker")
def test_stream_resumes_after_last_event_id_without_loss(live_server_url, demo_pair, api_key, main_alone_greedy):
    body = {"model": "demo-code", "prompt": PROMPT, "max_tokens": 400, "stream": True, "background": True,
            "num_assistant_tokens": 2}
    first = post(live_server_url, "/v1/completions", api_key.secret, body, stream=True)
    assert first.status_code == 200 and first.headers["Content-Type"].startswith("text/event-stream")
    generation_id = first.headers["X-Generation-Id"]
    received, last_id = [], None
    received_chunks = []
    for event_id, data in sse_events(first):
        received.append(chunk_text(data))
        received_chunks.append(data)
        last_id = event_id or last_id
        if len(received) == 2:
            break
    first.close()  # the connection drops; background: true keeps the generation running
    assert last_id

    chunk_id = json.loads(received_chunks[0])["id"]
    assert chunk_id == f"cmpl-{generation_id}"
    rest = requests.get(f"{live_server_url}/v1/completions/{chunk_id}/events", stream=True, timeout=120,
                        headers={"Authorization": f"Bearer {api_key.secret}", "Last-Event-ID": last_id})
    assert rest.status_code == 200
    resumed = list(sse_events(rest))
    assert resumed[-1][1] == "[DONE]"
    ids = [event_id for event_id, _ in resumed if event_id]
    assert all(tuple(map(int, i.split("-"))) > tuple(map(int, last_id.split("-"))) for i in ids)
    text = "".join(received) + "".join(chunk_text(data) for _, data in resumed)
    generation = wait_until_done(generation_id)
    assert generation.status == Generation.Status.FINISHED
    assert text == generation.text == main_alone_greedy(PROMPT, 400, add_special_tokens=True)

    again = requests.get(f"{live_server_url}/v1/completions/{generation_id}/events", timeout=60,
                         headers={"Authorization": f"Bearer {api_key.secret}", "Last-Event-ID": ids[-1]})
    assert list(sse_events(again)) == [(None, "[DONE]")]  # after the last event: nothing more, no hang
    bad = requests.get(f"{live_server_url}/v1/completions/{generation_id}/events", timeout=60,
                       headers={"Authorization": f"Bearer {api_key.secret}", "Last-Event-ID": "5-"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "Last-Event-ID"


@pytest.mark.usefixtures("celery_worker")
@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_stops_the_generation(live_server_url, demo_pair, api_key, stream):
    demo_pair.max_new_tokens_cap = 900
    demo_pair.save()
    body = {"model": "demo-code", "prompt": PROMPT, "max_tokens": 900, "ignore_eos": True, "stream": stream}
    if stream:
        response = post(live_server_url, "/v1/completions", api_key.secret, body, stream=True)
        next(event for event in sse_events(response) if chunk_text(event[1]))
        response.close()
    else:
        with pytest.raises(requests.ReadTimeout):  # the client gives up waiting and closes the connection
            post(live_server_url, "/v1/completions", api_key.secret, body, timeout=0.25)

    generation = wait_until_done()
    assert Generation.objects.count() == 1
    assert generation.status == Generation.Status.STOPPED and generation.finish_reason == "stopped"
    assert generation.completion_tokens < 900


@pytest.mark.usefixtures("celery_worker")
def test_per_key_concurrency_limit_answers_429_and_cancel_frees_it(live_server_url, demo_pair, api_key):
    ApiKey.objects.filter(id=api_key.id).update(max_concurrent=1)
    demo_pair.max_new_tokens_cap = 900
    demo_pair.save()
    body = {"model": "demo-code", "prompt": PROMPT, "max_tokens": 900, "ignore_eos": True, "stream": True,
            "background": True}
    running = post(live_server_url, "/v1/completions", api_key.secret, body, stream=True)
    generation_id = running.headers["X-Generation-Id"]
    running.close()

    api = client(live_server_url, api_key.secret, max_retries=0)
    with pytest.raises(openai.RateLimitError) as refused:
        api.completions.create(model="demo-code", prompt=PROMPT, max_tokens=4)
    assert refused.value.body["code"] == "concurrency_limit_exceeded"
    assert Generation.objects.count() == 1

    cancelled = post(live_server_url, f"/v1/completions/cmpl-{generation_id}/cancel", api_key.secret, {})  # as returned
    assert cancelled.status_code == 200 and cancelled.json()["id"] == f"cmpl-{generation_id}"
    generation = wait_until_done(generation_id)
    assert generation.status == Generation.Status.STOPPED and generation.completion_tokens < 900
    assert api.completions.create(model="demo-code", prompt=PROMPT, max_tokens=4).usage.completion_tokens >= 1
