"""The database taken away from a running stack, as a PostgreSQL restart or failover does, or a long
write lock on SQLite: a fault of the soak and of tests/test_database_outage.py.

The stack's processes name their PostgreSQL connections (libpq's `PGAPPNAME`), so an outage ends theirs
and leaves the caller's own (the soak's checks, a test's transaction) alone."""

from __future__ import annotations

import sqlite3
import time

import psycopg
from django.db import connection

STACK_APPLICATION_NAME = "specchat-stack"  # PGAPPNAME of a private stack's processes


def _maintenance_dsn() -> str:
    """A connection to the server's maintenance database: a database cannot lock itself out."""
    db = connection.settings_dict
    return psycopg.conninfo.make_conninfo(dbname="postgres", user=db.get("USER") or "postgres",
                                          host=db.get("HOST") or "127.0.0.1", port=db.get("PORT") or 5432,
                                          password=db.get("PASSWORD") or None)


def refuse_connections(*, refuse: bool, application_name: str = STACK_APPLICATION_NAME) -> None:
    """PostgreSQL only: refuse (or allow again) new connections to this database; refusing also ends
    the open connections named `application_name`."""
    name = connection.settings_dict["NAME"]
    with psycopg.connect(_maintenance_dsn(), autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS {"false" if refuse else "true"}')
        if refuse:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = %s AND application_name = %s", (name, application_name))


def database_outage(*, seconds: float, application_name: str = STACK_APPLICATION_NAME) -> None:
    """Take the database away for `seconds`: PostgreSQL refuses connections and ends the stack's;
    SQLite's write lock is held (readers go on, as its write-ahead log allows)."""
    if connection.vendor == "postgresql":
        refuse_connections(refuse=True, application_name=application_name)
        try:
            time.sleep(seconds)
        finally:
            refuse_connections(refuse=False)
        return
    lock = sqlite3.connect(connection.settings_dict["NAME"], timeout=30)
    try:
        lock.execute("BEGIN EXCLUSIVE")
        time.sleep(seconds)
    finally:
        lock.rollback()
        lock.close()
