"""The site's hardening (issue 25): login throttling, no default admin password outside DEBUG, /metrics
behind a setting, no `testserver` host with DEBUG off, and generic error messages for clients."""

import io
import os
import subprocess
import sys
import time

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.test import Client

from inference import errors, selectors
from inference.models import Generation, ModelPair
from inference.serving import web
from tests.conftest import ROOT, wait_until_done

pytestmark = [pytest.mark.django_db(transaction=True)]


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
    call_command("axes_reset", stdout=io.StringIO())  # ...and after the cool-off (here: reset), she is back
    assert log_in(Client(), "alice", "alice-password", path=path)


def test_ensure_admin_has_no_default_password_outside_debug(monkeypatch, settings, django_user_model):
    monkeypatch.delenv("SPECCHAT_ADMIN_PASSWORD", raising=False)
    monkeypatch.delenv("SPECCHAT_ADMIN_USER", raising=False)
    settings.DEBUG = False
    out = io.StringIO()
    call_command("ensure_admin", stdout=out)
    admin = django_user_model.objects.get(username="admin")
    assert not admin.check_password("admin")
    password = out.getvalue().split("password '")[1].split("'")[0]
    assert len(password) >= 20 and admin.check_password(password)


def test_ensure_admin_keeps_admin_admin_on_a_developers_machine(monkeypatch, settings, django_user_model):
    monkeypatch.delenv("SPECCHAT_ADMIN_PASSWORD", raising=False)
    monkeypatch.delenv("SPECCHAT_ADMIN_USER", raising=False)
    settings.DEBUG = True
    call_command("ensure_admin", stdout=io.StringIO())
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
