"""Who may get in and what a stranger can do to the site, on real parts (daphne, Redis, the
database, the settings as a fresh process reads them): malformed websocket input, the websocket's
origin check, production defaults, /health, admin permissions, revoked access on open streams, API keys
made from a script, login throttling, no default admin password outside DEBUG, /metrics behind a setting,
no `testserver` host with DEBUG off, and generic error messages for clients (issue 25)."""

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
import uuid
from io import StringIO
from pathlib import Path

import pytest
import requests
from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.test import Client, override_settings

from chatsite.chat.models import Conversation, Message
from inference import errors, selectors, transport
from inference.api import auth
from inference.models import ApiKey, Generation, HostCalibration, JobStatus, ModelPair
from inference.serving import web
from inference.serving.calibrated import CALIBRATION_FAILED
from tests.conftest import chat_socket, wait_until_done

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


# ---------------------------------------------- logins, the admin's password, /metrics, hosts, error messages
def log_in(client: Client, username: str, password: str, *, path: str = "/accounts/login/") -> bool:
    client.post(path, {"username": username, "password": password})
    return "_auth_user_id" in client.session


@pytest.mark.parametrize("path", ["/accounts/login/", "/admin/login/"])
def test_after_too_many_wrong_passwords_the_right_one_is_refused_for_a_while(django_user_model, user, path):
    django_user_model.objects.filter(id=user.id).update(is_staff=True)  # the admin's login takes staff only
    assert log_in(Client(), "alice", "alice-password", path=path)  # the right password works at first
    client = Client()
    for _ in range(django_settings.AXES_FAILURE_LIMIT):
        assert not log_in(client, "alice", "wrong", path=path)
    assert not log_in(client, "alice", "alice-password", path=path), "the right password worked after the limit"
    response = client.post(path, {"username": "alice", "password": "alice-password"})
    assert response.status_code in (403, 429)
    assert log_in(Client(), "bob-does-not-exist", "x") is False  # others are refused as ever...
    call_command("axes_reset", stdout=StringIO())  # ...and after the cool-off (here: reset), she is back
    assert log_in(Client(), "alice", "alice-password", path=path)


def test_behind_a_proxy_wrong_passwords_lock_the_address_they_came_from_not_the_username(settings, user):
    """Every login reaches daphne from the proxy's address; the proxy appends the client's to X-Forwarded-For."""
    settings.TRUSTED_PROXY_COUNT = 1

    def from_client(address: str, *, forged: str = "") -> Client:
        return Client(REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR=", ".join(filter(None, [forged, address])))

    attacker = from_client("203.0.113.9")
    for _ in range(django_settings.AXES_FAILURE_LIMIT):
        assert not log_in(attacker, "alice", "wrong")
    assert not log_in(attacker, "alice", "alice-password")  # locked where the wrong passwords came from...
    assert not log_in(from_client("203.0.113.9", forged="198.51.100.7"), "alice", "alice-password")  # ...forged or not
    assert log_in(from_client("198.51.100.7"), "alice", "alice-password")  # Alice, elsewhere, is not locked out


def test_ensure_admin_has_no_default_password_outside_debug(monkeypatch, settings, django_user_model):
    monkeypatch.delenv("SPECCHAT_ADMIN_PASSWORD", raising=False)
    monkeypatch.delenv("SPECCHAT_ADMIN_USER", raising=False)
    settings.DEBUG = False
    out = StringIO()
    call_command("ensure_admin", stdout=out)
    admin = django_user_model.objects.get(username="admin")
    assert not admin.check_password("admin")
    password = out.getvalue().split("password '")[1].split("'")[0]
    assert len(password) >= 20 and admin.check_password(password)


def test_ensure_admin_keeps_admin_admin_on_a_developers_machine(monkeypatch, settings, django_user_model):
    monkeypatch.delenv("SPECCHAT_ADMIN_PASSWORD", raising=False)
    monkeypatch.delenv("SPECCHAT_ADMIN_USER", raising=False)
    settings.DEBUG = True
    call_command("ensure_admin", stdout=StringIO())
    assert django_user_model.objects.get(username="admin").check_password("admin")


def test_metrics_need_the_token_or_an_open_setting(settings, redis_client):
    settings.METRICS_OPEN, settings.METRICS_TOKEN = False, ""
    assert Client().get("/metrics").status_code == 403
    settings.METRICS_TOKEN = "scraper-token"
    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    response = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scraper-token")
    assert response.status_code == 200 and b"# TYPE" in response.content
    settings.METRICS_OPEN, settings.METRICS_TOKEN = True, ""
    assert Client().get("/metrics").status_code == 200


@pytest.mark.parametrize("debug, expected", [("0", False), ("1", True)])
def test_testserver_is_an_allowed_host_only_with_debug(debug, expected):
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_ALLOWED_HOSTS", "DJANGO_SETTINGS_MODULE")}
    env.update(DJANGO_DEBUG=debug, DJANGO_SECRET_KEY="tests-only-" + "s" * 50)
    hosts = subprocess.run([sys.executable, "-c", "from chatsite import settings; print(settings.ALLOWED_HOSTS)"],
                           cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    assert ("testserver" in hosts) is expected and "localhost" in hosts


def test_a_pair_that_fails_to_load_tells_clients_no_paths_nor_exception_text(demo_pair, celery_worker, redis_client):
    # Saved around validation, as if its files broke after registration: the draft folder has no model.
    broken = ModelPair.objects.create(name="Broken", slug="broken", main_dir=demo_pair.main_dir,
                                      draft_dir="demo-code", num_assistant_tokens=3)
    # The first request finds the pair not yet tried (queued, then failed) or, once the worker's heartbeat
    # tells, already failed (refused at once): either way the client reads no path and no exception.
    told = []
    for _ in range(2):
        try:
            generation = web.start_generation(pair=broken, prompt="def f():",
                                              options=web.parse_options({"max_tokens": 4}), source=Generation.Source.API)
        except errors.ModelUnavailable as refused:
            told.append(refused.message)
            continue
        failed = wait_until_done(generation.id)
        assert failed.status == "failed"
        told.append(failed.error)
    for message in told:
        assert "failed to load" in message
        assert str(django_settings.MODELS_ROOT) not in message and "/models" not in message
        assert "Error" not in message and "Exception" not in message
    # The admin still sees why: the pair's page shows the worker's own words (an earlier test's pair of the
    # same slug may have failed on the session's worker already, so this pair's record need not hold them).
    deadline = time.monotonic() + 10
    while "openvino_model.xml" not in (state := selectors.pair_state(
            pair=broken, workers=selectors.live_workers(client=redis_client))).detail and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "openvino_model.xml" in state.detail, state


# ------------------------------------------------------------------ what a stranger reads of the host
def test_calibrations_are_shown_to_api_keys_only_and_their_failures_without_exception_text(live_server_url, demo_pair,
                                                                                           api_key):
    """Issue 56, row 5: anyone who reached the port read the CPU model, its ISA flags, the core count, the
    OpenVINO version and each configuration's speed, and a failed calibration's exception text."""
    facts = {"cpu": "Probe CPU 9000", "family": 25, "model": 17, "isa": ["AVX2", "AVX512F"], "cores": 2,
             "openvino": "2099.1", "device": "CPU"}
    HostCalibration.objects.create(pair=demo_pair, host="a" * 64, host_facts=facts, status=JobStatus.FAILED,
                                   error=f"RuntimeError: Exception from src/core/x.cpp:12: {django_settings.MODELS_ROOT}")
    anonymous = requests.get(f"{live_server_url}/v1/config", timeout=30)
    assert anonymous.status_code == 200 and anonymous.json()["demo-code"]["devices"], anonymous.text
    assert "calibrations" not in anonymous.json()["demo-code"]
    assert not any(fact in anonymous.text for fact in ("Probe CPU", "AVX512F", "2099.1", "RuntimeError"))
    keyed = requests.get(f"{live_server_url}/v1/config", headers={"Authorization": f"Bearer {api_key.secret}"},
                         timeout=30)
    shown = keyed.json()["demo-code"]["calibrations"]
    assert len(shown) == 1 and "Probe CPU 9000" in shown[0]["host"], shown
    assert shown[0]["error"] == {"code": "calibration_failed", "message": CALIBRATION_FAILED}
    assert not any(words in keyed.text for words in ("RuntimeError", "x.cpp", str(django_settings.MODELS_ROOT)))
    wrong = requests.get(f"{live_server_url}/v1/config", headers={"Authorization": "Bearer sk-spec-wrong"}, timeout=30)
    assert wrong.status_code == 401
