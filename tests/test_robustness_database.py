"""The database going away under a running site (a PostgreSQL restart, a failover): requests get a clear
503 in the API's error shape, not an internal error, and the site serves again once it is back. Real
daphne, a real worker, the PostgreSQL test database refusing connections; on PostgreSQL only (make test
runs the suite there too), since SQLite has no server to lose."""

import time

import psycopg
import pytest
from django.db import connection

from inference.models import Generation
from tests.api_client import PROMPT, post

pytestmark = pytest.mark.django_db(transaction=True)


def _admin_dsn() -> str:
    """A connection to the server's maintenance database: a database cannot lock itself out."""
    db = connection.settings_dict
    return psycopg.conninfo.make_conninfo(dbname="postgres", user=db.get("USER") or "postgres",
                                          host=db.get("HOST") or "127.0.0.1", port=db.get("PORT") or 5432,
                                          password=db.get("PASSWORD") or None)


def _refuse_connections(name: str, *, keep_pid: int, refuse: bool) -> None:
    with psycopg.connect(_admin_dsn(), autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS {"false" if refuse else "true"}')
        if refuse:  # as a restart does: every open connection goes (but this test's own)
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> %s",
                          (name, keep_pid))


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite has no server to lose")
@pytest.mark.usefixtures("celery_worker")
def test_the_api_answers_503_while_the_database_is_gone_and_serves_again_after(live_server_url, demo_pair, api_key):
    body = {"model": "demo-code", "prompt": PROMPT, "max_tokens": 8}
    assert post(live_server_url, "/v1/completions", api_key.secret, body).status_code == 200

    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        own_pid = cursor.fetchone()[0]
    _refuse_connections(name, keep_pid=own_pid, refuse=True)
    try:
        refused = post(live_server_url, "/v1/completions", api_key.secret, body)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "database_unavailable"
        assert "try again" in refused.json()["error"]["message"]
    finally:
        _refuse_connections(name, keep_pid=own_pid, refuse=False)

    deadline = time.monotonic() + 30
    while (answer := post(live_server_url, "/v1/completions", api_key.secret, body)).status_code != 200:
        assert time.monotonic() < deadline, answer.text  # the site reconnects on its own
        time.sleep(0.5)
    assert answer.json()["usage"]["completion_tokens"] == 8
    assert Generation.objects.filter(status=Generation.Status.FINISHED).count() == 2
