"""The database under a running site. When it goes away (a PostgreSQL restart, a failover), requests get a
clear 503 in the API's error shape, not an internal error, and the site serves again once it is back:
real daphne, a real worker, the PostgreSQL test database refusing connections (make test runs the suite
there too; SQLite has no server to lose). And the web keeps no connection past its request."""

import subprocess
import sys
import time

import psycopg
import pytest
from django.db import connection

from inference.models import Generation
from tests.api_client import PROMPT, post
from tests.conftest import ROOT, STACK_APPLICATION_NAME

pytestmark = pytest.mark.django_db(transaction=True)


def _admin_dsn() -> str:
    """A connection to the server's maintenance database: a database cannot lock itself out."""
    db = connection.settings_dict
    return psycopg.conninfo.make_conninfo(dbname="postgres", user=db.get("USER") or "postgres",
                                          host=db.get("HOST") or "127.0.0.1", port=db.get("PORT") or 5432,
                                          password=db.get("PASSWORD") or None)


def _refuse_connections(name: str, *, refuse: bool) -> None:
    with psycopg.connect(_admin_dsn(), autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS {"false" if refuse else "true"}')
        if refuse:  # as a restart does: the site's and the workers' open connections go (not the test process's)
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = %s AND application_name = %s", (name, STACK_APPLICATION_NAME))


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite has no server to lose")
@pytest.mark.usefixtures("celery_worker")
def test_the_api_answers_503_while_the_database_is_gone_and_serves_again_after(live_server_url, demo_pair, api_key):
    body = {"model": "demo-code", "prompt": PROMPT, "max_tokens": 8}
    assert post(live_server_url, "/v1/completions", api_key.secret, body).status_code == 200

    name = connection.settings_dict["NAME"]
    _refuse_connections(name, refuse=True)
    try:
        refused = post(live_server_url, "/v1/completions", api_key.secret, body)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "database_unavailable"
        assert "try again" in refused.json()["error"]["message"]
    finally:
        _refuse_connections(name, refuse=False)

    deadline = time.monotonic() + 30
    while (answer := post(live_server_url, "/v1/completions", api_key.secret, body)).status_code != 200:
        assert time.monotonic() < deadline, answer.text  # the site reconnects on its own
        time.sleep(0.5)
    assert answer.json()["usage"]["completion_tokens"] == 8
    assert Generation.objects.filter(status=Generation.Status.FINISHED).count() == 2



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
