"""The database under a running site. When it goes away (a PostgreSQL restart, a failover), requests get a
clear 503 in the API's error shape, not an internal error, and the site serves again once it is back:
real daphne, a real worker, the PostgreSQL test database refusing connections (make test runs the suite
there too; SQLite has no server to lose). And the web keeps no connection past its request."""

import asyncio
import json
import subprocess
import sys
import time

import aiohttp
import pytest
from django.db import connection

from inference.benchmark.outages import refuse_connections
from inference.benchmark.servers import open_session, session_cookie
from inference.models import Generation
from tests.api_client import PROMPT, chunk_text, post, sse_events
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite has no server to lose")
@pytest.mark.usefixtures("celery_worker")
def test_the_api_answers_503_while_the_database_is_gone_and_serves_again_after(live_server_url, demo_pair, api_key):
    body = {"model": "demo-code", "prompt": PROMPT, "max_tokens": 8}
    assert post(live_server_url, "/v1/completions", api_key.secret, body).status_code == 200

    refuse_connections(refuse=True)
    try:
        refused = post(live_server_url, "/v1/completions", api_key.secret, body)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "database_unavailable"
        assert "try again" in refused.json()["error"]["message"]
    finally:
        refuse_connections(refuse=False)

    deadline = time.monotonic() + 30
    while (answer := post(live_server_url, "/v1/completions", api_key.secret, body)).status_code != 200:
        assert time.monotonic() < deadline, answer.text  # the site reconnects on its own
        time.sleep(0.5)
    assert answer.json()["usage"]["completion_tokens"] == 8
    assert Generation.objects.filter(status=Generation.Status.FINISHED).count() == 2


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite has no server to lose")
@pytest.mark.usefixtures("celery_worker")
def test_a_stream_goes_on_through_a_database_restart_and_ends_as_stored(live_server_url, large_demo_pair, api_key):
    """The stream is read from Redis while the database is gone (its key is rechecked every second
    meanwhile); the worker writes the record once it is back; the text streamed is the text stored."""
    body = {"model": "demo-code", "prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "stream": True}
    with post(live_server_url, "/v1/completions", api_key.secret, body, stream=True) as response:
        assert response.status_code == 200, response.text
        generation_id, text, ended = response.headers["X-Generation-Id"], "", False
        for index, (_, data) in enumerate(sse_events(response)):
            if index == 3:
                refuse_connections(refuse=True)
                try:
                    time.sleep(3)
                finally:
                    refuse_connections(refuse=False)
            ended = data == "[DONE]"
            if not ended:
                assert "error" not in json.loads(data), data
                text += chunk_text(data)
    generation = Generation.objects.get(id=generation_id)
    assert ended and generation.status == Generation.Status.FINISHED
    assert generation.completion_tokens == 400 and text == generation.text


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite has no server to lose")
def test_a_chat_socket_opened_while_the_database_is_gone_is_told_why(live_server_url, user):
    """Not the bare HTTP 500 daphne answers a handshake that fails: the chat's error frame, then a close
    with 4503 (try again later), after which the page reconnects on its own."""
    cookie = session_cookie(open_session(user_id=user.pk))

    async def handshake() -> tuple[dict, int | None]:
        async with aiohttp.ClientSession() as http, http.ws_connect(
                live_server_url.replace("http", "ws", 1) + "/ws/chat/", origin=live_server_url,
                headers={"Cookie": cookie}) as ws:
            frame = await ws.receive_json(timeout=10)
            await ws.receive(timeout=10)
            return frame, ws.close_code

    refuse_connections(refuse=True)
    try:
        frame, code = asyncio.run(handshake())
    finally:
        refuse_connections(refuse=False)
    assert frame["type"] == "error" and frame["code"] == "database_unavailable", frame
    assert code == 4503


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite has no server to lose")
def test_an_open_chat_socket_whose_session_cannot_be_checked_is_closed(live_server_url, user, settings):
    """A logout during the outage could not be seen: after two failed rechecks the socket is closed (4503,
    the page reconnects once the database is back) rather than kept open on a session nobody vouches for."""
    cookie = session_cookie(open_session(user_id=user.pk))

    async def held_open() -> tuple[dict, int | None, float]:
        async with aiohttp.ClientSession() as http, http.ws_connect(
                live_server_url.replace("http", "ws", 1) + "/ws/chat/", origin=live_server_url,
                headers={"Cookie": cookie}) as ws:
            await asyncio.sleep(1.5 * settings.ACCESS_RECHECK_S)  # rechecked once with the database there
            refuse_connections(refuse=True)
            gone_at = time.monotonic()
            frame = await ws.receive_json(timeout=10 * settings.ACCESS_RECHECK_S)
            await ws.receive(timeout=10)
            return frame, ws.close_code, time.monotonic() - gone_at

    try:
        frame, code, after_s = asyncio.run(held_open())
    finally:
        refuse_connections(refuse=False)
    assert frame["code"] == "database_unavailable" and code == 4503, frame
    assert after_s <= 3 * settings.ACCESS_RECHECK_S + 1


def test_the_web_keeps_no_connection_past_its_request(stack_env):
    """Each ASGI request runs in a thread of its own that ends with it, so a connection kept for reuse
    outlived it: 16 streams used up PostgreSQL's 100 connections within 30 s (the soak, 400 answers:
    100 connections open and 19 answers refused before; at most 37, all closed after, and none refused
    now). Workers, whose threads live on, keep theirs for CONN_MAX_AGE."""
    def conn_max_age(module: str) -> str:
        code = (f"import {module}; from django.db import connection; "
                "print(connection.settings_dict['CONN_MAX_AGE'])")
        return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**stack_env, "CONN_MAX_AGE": "60"},
                              capture_output=True, text=True, check=True).stdout.split()[-1]

    assert conn_max_age("chatsite.asgi") == "0"  # daphne's application
    assert conn_max_age("chatsite.celery") == "60"  # the worker's app, with settings loaded
