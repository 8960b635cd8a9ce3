"""The chat socket's robustness (issue 25): a socket closes when its session ends, sockets never wait
on each other, and hostile JSON gets an error frame. Real parts: the ASGI application with its session
and auth middleware, the test database and Redis."""

import asyncio
import time
import uuid

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.sessions.models import Session
from django.test import Client

from chatsite.chat import access
from inference import transport
from inference.models import Generation

pytestmark = [pytest.mark.django_db(transaction=True)]


async def logged_in_socket(user) -> tuple[WebsocketCommunicator, Client]:
    """An open chat socket on a session of `user`, and the browser (client) holding that session."""
    from chatsite.asgi import application

    client = Client()
    await sync_to_async(client.force_login)(user)
    headers = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1"),
               (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]
    communicator = WebsocketCommunicator(application, "/ws/chat/", headers=headers)
    assert (await communicator.connect())[0]
    return communicator, client


def _change_password(user, client):
    user.set_password("a-new-password-1")
    user.save()


ENDINGS = {
    "logout": lambda user, client: client.logout(),
    "password changed": _change_password,
    "sessions deleted": lambda user, client: Session.objects.all().delete(),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
async def test_a_socket_closes_when_its_session_ends(user, ending, settings):
    communicator, client = await logged_in_socket(user)
    await communicator.receive_nothing(timeout=2.5 * settings.ACCESS_RECHECK_S)  # rechecked, still open
    ended_at = time.monotonic()
    await sync_to_async(ENDINGS[ending])(user, client)
    reply = await communicator.receive_json_from(timeout=10)
    assert reply["type"] == "error" and reply["code"] == "access_revoked", reply
    assert reply["message"] == access.SESSION_ENDED
    assert await communicator.receive_output(timeout=5) == {"type": "websocket.close", "code": 4401}
    assert time.monotonic() - ended_at < 10
    await communicator.disconnect()


async def test_a_logged_out_socket_leaves_its_answer_to_the_abandon_grace(demo_pair, user, settings):
    """A logout closes the socket; the answer it followed, watched by nobody else, is stopped."""
    generation = await Generation.objects.acreate(pair=demo_pair, user=user, prompt="def f():",
                                                  status=Generation.Status.RUNNING)
    communicator, client = await logged_in_socket(user)
    await communicator.send_json_to({"action": "follow", "generation": str(generation.id)})
    await communicator.receive_nothing(timeout=0.5)
    await sync_to_async(client.logout)()
    assert (await communicator.receive_json_from(timeout=10))["code"] == "access_revoked"
    assert (await communicator.receive_output(timeout=5))["type"] == "websocket.close"
    await communicator.disconnect()
    deadline = time.monotonic() + settings.CHAT_ABANDON_GRACE_S + 5
    while not transport.sync_client().exists(transport.cancel_key(generation.id)):
        assert time.monotonic() < deadline, "the abandoned answer was not asked to stop"
        await asyncio.sleep(0.1)


async def test_another_users_stop_does_not_wait_on_a_held_chat_lock(demo_pair, user, other_user, redis_client):
    """Alice's message waits on her chat lock (held here, as a burst of her tabs would); Bob's stop of
    his own answer, and his stop of an unknown one, complete meanwhile."""
    bobs = await Generation.objects.acreate(pair=demo_pair, user=other_user, prompt="def f():",
                                            status=Generation.Status.RUNNING)
    alice, _ = await logged_in_socket(user)
    bob, _ = await logged_in_socket(other_user)
    lock = transport.slot_lock("chat", user.pk)
    redis_client.set(lock, "held-by-the-test", ex=30)
    try:
        await alice.send_json_to({"action": "send", "pair": demo_pair.slug, "text": "def f():",
                                  "settings": {"max_tokens": 4}})
        await alice.receive_nothing(timeout=0.3)  # her send is waiting on the lock now
        started = time.monotonic()
        await bob.send_json_to({"action": "stop", "generation": str(uuid.uuid4()), "ref": "unknown"})
        reply = await bob.receive_json_from(timeout=10)
        assert reply["ref"] == "unknown" and reply["code"] == "not_found"
        assert time.monotonic() - started < 0.5, f"took {time.monotonic() - started:.2f} s"
        started = time.monotonic()
        await bob.send_json_to({"action": "stop", "generation": str(bobs.id)})
        while not redis_client.exists(transport.cancel_key(bobs.id)):
            assert time.monotonic() - started < 0.5, "Bob's stop waited on Alice's chat lock"
            await asyncio.sleep(0.01)
    finally:
        redis_client.delete(lock)
    reply = await alice.receive_json_from(timeout=15)  # her send goes on once the lock is free
    assert reply["type"] in ("started", "error"), reply
    await Generation.objects.filter(user=user).aupdate(status=Generation.Status.STOPPED)
    await alice.disconnect()
    await bob.disconnect()


@pytest.mark.parametrize("payload", [
    "[" * 100_000 + "]" * 100_000,  # deeper than the parser goes
    '{"action": "send", "settings": ' + '{"a": ' * 200 + "1" + "}" * 200 + "}",  # parsed, but too deep
])
async def test_deeply_nested_json_gets_an_error_frame(user, payload):
    communicator, _ = await logged_in_socket(user)
    await communicator.send_to(text_data=payload)
    reply = await communicator.receive_json_from(timeout=10)
    assert reply["type"] == "error" and reply["code"] == "invalid_json", reply
    assert "nests deeper than 16 levels" in reply["message"]
    await communicator.send_json_to({"action": "dance"})  # the socket is still open and answering
    assert (await communicator.receive_json_from(timeout=10))["param"] == "action"
    await communicator.disconnect()


async def test_a_follow_that_fails_unexpectedly_still_ends_on_the_page(demo_pair, user, redis_client):
    """Whatever breaks a follow (here Redis answers the stream's read with an error the reader does not expect: its
    key holds no stream), the page gets the answer's end, not silence, and the socket goes on answering."""
    generation = await Generation.objects.acreate(pair=demo_pair, user=user, prompt="def f():",
                                                  status=Generation.Status.RUNNING)
    redis_client.set(transport.stream_key(generation.id), "not a stream", ex=60)
    communicator, _ = await logged_in_socket(user)
    try:
        await communicator.send_json_to({"action": "follow", "generation": str(generation.id)})
        reply = await communicator.receive_json_from(timeout=10)
        assert reply["generation"] == str(generation.id) and reply["event"]["type"] == "error", reply
        assert "Reload to see the answer as saved" in reply["event"]["message"]
        await communicator.send_json_to({"action": "dance"})
        assert (await communicator.receive_json_from(timeout=10))["param"] == "action"
    finally:
        redis_client.delete(transport.stream_key(generation.id))
        await Generation.objects.filter(id=generation.id).aupdate(status=Generation.Status.STOPPED)
        await communicator.disconnect()
