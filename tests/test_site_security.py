"""Who may get in and what a stranger can do to the site, on real parts (daphne, Redis, the
database, the settings as a fresh process reads them) and without a worker: malformed websocket
input, the websocket's origin check, production defaults, /health, admin permissions, revoked
access on open streams, and API keys made from a script."""

import json
import os
import secrets
import subprocess
import sys
import urllib.request
import uuid
from io import StringIO
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.test import Client, override_settings

from chatsite.chat.models import Conversation, Message
from inference import transport
from inference.api import auth
from inference.models import ApiKey, Generation
from tests.conftest import chat_socket

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ malformed websocket input
async def reply_to(communicator, payload) -> dict:
    if isinstance(payload, str):
        await communicator.send_to(text_data=payload)
    else:
        await communicator.send_json_to(payload)
    return await communicator.receive_json_from(timeout=10)


def finished_generation(*, pair, user, text="def f():\n    return 1\n") -> Generation:
    """A kept answer of `user`, as the worker leaves it."""
    generation = Generation.objects.create(pair=pair, user=user, prompt="def f():", status=Generation.Status.FINISHED,
                                           text=text, steps=[["", text]], finish_reason="stop")
    conversation = Conversation.objects.create(user=user, pair=pair, title="def f():")
    asked = Message.objects.create(conversation=conversation, role=Message.Role.USER, content="def f():")
    Message.objects.create(conversation=conversation, parent=asked, role=Message.Role.ASSISTANT,
                           generation=generation)
    return generation


async def test_malformed_websocket_input_is_answered_and_the_socket_stays_usable(demo_pair, user):
    generation = await sync_to_async(finished_generation)(pair=demo_pair, user=user)
    message = await Message.objects.aget(generation=generation)
    communicator = await chat_socket(user)
    assert (await communicator.connect())[0]
    send = {"action": "send", "pair": "demo-code", "text": "def f():"}
    cases = [
        ({**send, "settings": [1, 2]}, "settings"),
        ({**send, "settings": {"seed": -1}}, "seed"),
        ({**send, "pair": ["demo-code"]}, "pair"),
        ({"action": "follow", "generation": str(generation.id), "after": 5}, "after"),
        ({"action": "follow", "generation": str(generation.id), "after": ["0-0"]}, "after"),
        ({"action": "regenerate", "message": "one"}, "message"),
        ({"action": "regenerate", "message": 1.5}, "message"),
        ({"action": "regenerate", "message": message.id, "settings": "fast"}, "settings"),
        ({"type": "send", "text": "hi"}, "action"),
        ({"action": "dance"}, "action"),
        ("not json", None),
        ("[1, 2]", None),
    ]
    for payload, field in cases:
        reply = await reply_to(communicator, payload)
        assert reply["type"] == "error" and reply["param"] == field, (payload, reply)
        if field:
            assert field in reply["message"], reply
        # still open and answering: a follow of an unknown answer gets its own error
        probe = await reply_to(communicator, {"action": "follow", "generation": str(uuid.uuid4())})
        assert probe["code"] == "not_found", (payload, probe)
    assert await Generation.objects.acount() == 1  # nothing was started
    await communicator.disconnect()


# ------------------------------------------------------------------ origin of websockets
ORIGINS = [
    # (Origin, Host, extra headers, settings, accepted)
    ("http://127.0.0.1", "127.0.0.1", {}, {}, True),
    ("http://127.0.0.1:8000", "127.0.0.1:8000", {}, {}, True),
    ("https://127.0.0.1:8000", "127.0.0.1:8000", {}, {}, False),  # another scheme
    ("http://127.0.0.1:9999", "127.0.0.1:8000", {}, {}, False),  # another port
    ("http://localhost:8000", "127.0.0.1:8000", {}, {}, False),  # another host, though an allowed one
    ("null", "127.0.0.1", {}, {}, False),
    ("http://evil.example", "evil.example", {}, {}, False),  # a host this site does not answer for
    # behind a TLS proxy that says so
    ("https://127.0.0.1", "127.0.0.1", {"x-forwarded-proto": "https"},
     {"SECURE_PROXY_SSL_HEADER": ("HTTP_X_FORWARDED_PROTO", "https")}, True),
    ("https://127.0.0.1", "127.0.0.1", {"x-forwarded-proto": "https"}, {}, False),  # a header nobody trusts
    # a proxy that rewrites Host, with the public origin trusted explicitly
    ("https://chat.example.com", "127.0.0.1:8000", {}, {"CSRF_TRUSTED_ORIGINS": ["https://chat.example.com"]}, True),
]


@pytest.mark.parametrize("origin, host, extra, overrides, accepted", ORIGINS)
async def test_websocket_origin_must_be_this_sites_scheme_host_and_port(user, origin, host, extra, overrides,
                                                                         accepted):
    with override_settings(**overrides):
        communicator = await chat_socket(user, origin=origin, host=host)
        communicator.scope["headers"] += [(k.encode(), v.encode()) for k, v in extra.items()]
        connected, _ = await communicator.connect()
        assert connected == accepted
        if connected:
            await communicator.disconnect()


async def test_websocket_without_origin_is_refused(user):
    communicator = await chat_socket(user)
    communicator.scope["headers"] = [h for h in communicator.scope["headers"] if h[0] != b"origin"]
    assert not (await communicator.connect())[0]


# ------------------------------------------------------------------ production defaults
def settings_in_a_fresh_process(env: dict[str, str]) -> subprocess.CompletedProcess:
    """chatsite.settings as `manage.py` or daphne reads it, under exactly `env`."""
    script = ("import json, django; django.setup(); from django.conf import settings as s; print(json.dumps({"
              "'DEBUG': s.DEBUG, 'SESSION_COOKIE_SECURE': s.SESSION_COOKIE_SECURE, "
              "'CSRF_COOKIE_SECURE': s.CSRF_COOKIE_SECURE, 'SECURE_HSTS_SECONDS': s.SECURE_HSTS_SECONDS, "
              "'SECURE_SSL_REDIRECT': s.SECURE_SSL_REDIRECT, 'SECURE_PROXY_SSL_HEADER': s.SECURE_PROXY_SSL_HEADER}))")
    base = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "chatsite.settings",
            "SPECCHAT_VAR_DIR": os.environ.get("SPECCHAT_VAR_DIR", str(ROOT / "var"))}
    return subprocess.run([sys.executable, "-c", script], check=False, cwd=ROOT, env={**base, **env}, capture_output=True,
                          text=True, timeout=60)


def dockerfile_env() -> dict[str, str]:
    """The ENV lines of the Dockerfile: what the image's command runs under when nothing else is set."""
    env = {}
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("ENV "):
            env.update(part.split("=", 1) for part in line[4:].split())
    return env


def test_debug_is_off_and_the_dev_secret_refused_unless_asked():
    nothing = settings_in_a_fresh_process({})
    assert nothing.returncode != 0 and "DJANGO_SECRET_KEY" in nothing.stderr  # no key, no DEBUG: refuses
    image = settings_in_a_fresh_process(dockerfile_env())
    assert image.returncode != 0 and "DJANGO_SECRET_KEY" in image.stderr  # the image's command too
    dev_key = settings_in_a_fresh_process({"DJANGO_SECRET_KEY": "dev-only-insecure-key-change-me"})
    assert dev_key.returncode != 0 and "DJANGO_SECRET_KEY" in dev_key.stderr
    keyed = settings_in_a_fresh_process({**dockerfile_env(), "DJANGO_SECRET_KEY": secrets.token_urlsafe(50)})
    assert keyed.returncode == 0, keyed.stderr
    assert json.loads(keyed.stdout)["DEBUG"] is False
    developer = settings_in_a_fresh_process({"DJANGO_DEBUG": "1"})  # `make run`
    assert developer.returncode == 0 and json.loads(developer.stdout)["DEBUG"] is True


def test_https_settings_come_from_the_environment_and_pass_djangos_deploy_check():
    production = {"DJANGO_SECRET_KEY": secrets.token_urlsafe(50), "DJANGO_SESSION_COOKIE_SECURE": "1",
                  "DJANGO_CSRF_COOKIE_SECURE": "1", "DJANGO_SECURE_HSTS_SECONDS": "31536000",
                  "DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS": "1", "DJANGO_SECURE_HSTS_PRELOAD": "1",
                  "DJANGO_SECURE_SSL_REDIRECT": "1", "DJANGO_SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https"}
    read = settings_in_a_fresh_process(production)
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout) == {
        "DEBUG": False, "SESSION_COOKIE_SECURE": True, "CSRF_COOKIE_SECURE": True, "SECURE_HSTS_SECONDS": 31536000,
        "SECURE_SSL_REDIRECT": True, "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"]}
    base = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "chatsite.settings"}
    check = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], check=False, cwd=ROOT,
                           env={**base, **production}, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr + check.stdout


def test_health_does_not_tell_strangers_why(caplog):
    with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):  # a port nothing listens on
        response = Client().get("/health")
    assert response.status_code == 503
    body = response.content.decode()
    assert "127.0.0.1:1" not in body and "Connection" not in body and "Error" not in body, body
    assert json.loads(body)["error"]["message"]
    assert "127.0.0.1:1" in caplog.text  # the operator finds the cause in the log


# ------------------------------------------------------------------ admin
def test_pair_actions_need_the_change_permission(demo_pair, django_user_model):
    viewer = django_user_model.objects.create_user(username="viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_modelpair"))
    editor = django_user_model.objects.create_user(username="editor", password="pw", is_staff=True)
    editor.user_permissions.add(Permission.objects.get(codename="view_modelpair"),
                                Permission.objects.get(codename="change_modelpair"))
    url = "/admin/inference/modelpair/"
    actions = ("load_on_worker", "unload_from_worker", "run_benchmark")
    client = Client()
    client.force_login(editor)
    listing = client.get(url).content.decode()
    assert all(f'value="{a}"' in listing for a in actions)

    client.force_login(viewer)
    listing = client.get(url).content.decode()
    assert not any(f'value="{a}"' in listing for a in actions)
    for action in actions:
        response = client.post(url, {"action": action, "_selected_action": [demo_pair.pk], "index": 0}, follow=True)
        shown = [str(m) for m in response.context["messages"]]
        assert not any(demo_pair.slug in m or "worker" in m for m in shown), (action, shown)
        assert "Run benchmark on a worker" not in response.content.decode()  # not the benchmark form either


# ------------------------------------------------------------------ revoked access on open streams
def running_generation(*, pair, user=None, api_key=None) -> Generation:
    """An answer still being written (its worker has not sent anything yet)."""
    return Generation.objects.create(pair=pair, user=user, api_key=api_key, prompt="def f():",
                                     status=Generation.Status.RUNNING)


@pytest.mark.parametrize("revoke", ["key revoked", "owner deactivated"])
def test_revoked_key_ends_its_open_sse_stream(demo_pair, user, live_server_url, revoke):
    key = ApiKey(name="ci", user=user)
    secret = auth.set_new_key(key)
    key.save()
    generation = running_generation(pair=demo_pair, api_key=key)
    transport.StreamWriter(transport.sync_client(), generation.id).send({"type": "delta", "steps": [["", "def"]]})
    request = urllib.request.Request(f"{live_server_url}/v1/completions/{generation.id}/events",
                                     headers={"Authorization": f"Bearer {secret}"})
    with urllib.request.urlopen(request, timeout=15) as response:  # a read waiting longer fails the test
        assert response.status == 200
        first = next(line for line in map(bytes.decode, response) if line.startswith("data:"))
        assert json.loads(first[5:])["choices"][0]["text"] == "def"
        if revoke == "key revoked":
            ApiKey.objects.filter(id=key.id).update(revoked=True)
        else:
            type(user).objects.filter(id=user.id).update(is_active=False)
        data = [line[5:].strip() for line in map(bytes.decode, response) if line.startswith("data:")]
    assert data[-1] == "[DONE]" and len(data) == 2
    assert "revoked" in json.loads(data[0])["error"]["message"]


async def test_deactivated_user_loses_the_open_chat_socket(demo_pair, user):
    generation = await sync_to_async(running_generation)(pair=demo_pair, user=user)
    communicator = await chat_socket(user)
    assert (await communicator.connect())[0]
    await communicator.send_json_to({"action": "follow", "generation": str(generation.id)})
    await communicator.receive_nothing(timeout=0.5)
    await type(user).objects.filter(id=user.id).aupdate(is_active=False)
    reply = await communicator.receive_json_from(timeout=10)
    assert reply["type"] == "error" and reply["code"] == "access_revoked"
    closed = await communicator.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": 4401}
    # and the answer is asked to stop (the worker checks this flag at each step)
    assert transport.sync_client().exists(transport.cancel_key(generation.id))
    await communicator.disconnect()  # as the browser does after a close


# ------------------------------------------------------------------ API keys from a script
def test_create_api_key_prints_a_working_secret_once(user):
    out = StringIO()
    call_command("create_api_key", "--name", "ci", "--user", "alice", "--max-concurrent", "3", stdout=out)
    secret = out.getvalue().strip().splitlines()[-1]
    key = auth.authenticate(authorization=f"Bearer {secret}")
    assert (key.name, key.user, key.max_concurrent) == ("ci", user, 3)
    assert secret not in json.dumps(list(ApiKey.objects.values()), default=str)  # only its hash is kept
    call_command("create_api_key", "--name", "anonymous", stdout=StringIO())
    anonymous = ApiKey.objects.get(name="anonymous")
    assert anonymous.max_concurrent == 4 and anonymous.user is None
    with pytest.raises(CommandError, match="nobody"):
        call_command("create_api_key", "--name", "x", "--user", "nobody", stdout=StringIO())
