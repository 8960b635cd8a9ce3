"""Real parts for the tests: Redis (its own DB number), a Celery worker and daphne as subprocesses
on the test database, and the shipped demo pair."""

from __future__ import annotations

import fcntl
import io
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

import pytest
import redis
from django.conf import settings

from inference.benchmark import outages
from inference.celery_worker import worker_command

ROOT = Path(__file__).resolve().parent.parent
TEST_QUEUES = "pair.demo-code,pair.demo-plain,pair.broken"
# A test that asks for any of these runs on the real stack (Redis, a worker, daphne, models, a browser):
# it is marked `stack`, so `pytest -m "not stack"` is the fast tier.
STACK_FIXTURES = {"redis_client", "stack_env", "celery_worker", "live_server_url", "demo_pair", "large_demo_pair",
                  "main_alone_greedy",
                  "transactional_db", "db", "client", "admin_client", "django_user_model"}


_SESSION_LOCKS: list[io.TextIOWrapper] = []  # held open until the session's process ends


def pytest_sessionstart(session):
    """A test database file is made anew each session; a write-ahead log a killed session left beside it
    would be replayed into the new file. A session running on the same file (the same SPECCHAT_TEST_REDIS_DB) is
    told apart by a lock, not broken: removing its log under it fails its every test with a disk I/O error."""
    test_name = settings.DATABASES["default"].get("TEST", {}).get("NAME") or ""
    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3") and test_name:
        lock = Path(test_name + ".lock").open("w")  # noqa: SIM115 (held until the session ends)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            pytest.exit(f"another test session uses {test_name}: run this one with another SPECCHAT_TEST_REDIS_DB "
                        f"(its Redis database and its SQLite file)", returncode=3)
        _SESSION_LOCKS.append(lock)
        for leftover in (Path(test_name + "-wal"), Path(test_name + "-shm")):
            leftover.unlink(missing_ok=True)
    if settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        _flush_again_after_a_deadlock()


def _flush_again_after_a_deadlock(attempts: int = 3) -> None:
    """On PostgreSQL the TRUNCATE that empties the database after a test can deadlock with a worker reading meanwhile
    (PostgreSQL then ends the TRUNCATE: the test errs at teardown, and the next one finds its rows): run it again."""
    from django.core.management.base import CommandError
    from django.core.management.commands import flush

    handle = flush.Command.handle

    def handle_again_after_a_deadlock(self, **options):
        for attempt in range(attempts):
            try:
                return handle(self, **options)
            except CommandError as exc:
                if attempt == attempts - 1 or "deadlock detected" not in str(exc.__cause__):
                    raise
                time.sleep(0.5)
        return None

    flush.Command.handle = handle_again_after_a_deadlock


def pytest_collection_modifyitems(items):
    """`stack` on a test that needs real parts; `no_database` on one that never reaches the database (no
    `django_db` mark, and none of its fixtures set the test database up), so the PostgreSQL pass skips it."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if STACK_FIXTURES & fixtures or item.get_closest_marker("django_db"):
            item.add_marker(pytest.mark.stack)
        if "django_db_setup" not in fixtures and not item.get_closest_marker("django_db"):
            item.add_marker(pytest.mark.no_database)


def _database_url() -> str:
    from django.db import connection

    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    user = db.get("USER") or ""
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    at = f"{user}{password}@" if user else ""
    return f"postgres://{at}{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test database; on PostgreSQL, connections left open in other threads (asgiref's
    executor) are ended first, or the database could not be dropped at the end."""
    yield
    from django.db import connection

    if connection.vendor == "postgresql":
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        connection.close()


@pytest.fixture(scope="session")
def redis_client(django_db_setup):
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    client.flushdb()
    return client


@pytest.fixture(scope="session")
def stack_env(django_db_setup, redis_client) -> dict[str, str]:
    """The environment of the subprocesses: same settings, the test database, the test Redis DB."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",  # same password hasher as the test process
        "DATABASE_URL": _database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "SPECCHAT_MODELS_ROOT": str(settings.MODELS_ROOT),
        "SPECCHAT_STALL_TIMEOUT_S": str(settings.STALL_TIMEOUT_S),
        "SPECCHAT_LIVE_FIGURES_S": "0",  # plans follow the profile a test sets, whatever earlier tests ran
        "SPECCHAT_CALIBRATE_ON_LOAD": "0",  # likewise (tests/test_calibration.py turns it on for its own worker)
        "SPECCHAT_CALIBRATION_TOKENS": "8", "SPECCHAT_CALIBRATION_KS": "1,2",  # the demo pair's, in seconds
        "SPECCHAT_CALIBRATION_STOPPED_KS": "4",
        "PYTHONPATH": str(ROOT),
        "PGAPPNAME": outages.STACK_APPLICATION_NAME,  # libpq's: a test can tell the stack's connections from its own
    }


class Worker:
    started: ClassVar[list[Worker]] = []  # those still running, for tests that must pause them

    def __init__(self, env: dict[str, str], queues: str, log_path: Path):
        Worker.started.append(self)
        self.log_path = log_path
        self.log = open(log_path, "w")  # noqa: SIM115 - closed by stop(), the worker writes to it meanwhile
        self.proc = subprocess.Popen(
            worker_command(queues=queues.split(","), concurrency=8, name=f"test-{os.getpid()}-{time.time_ns()}@%h"),
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
        )

    def wait_ready(self, client: redis.Redis, timeout: float = 60) -> str:
        from inference import transport

        deadline = time.time() + timeout
        while time.time() < deadline:
            for key in client.scan_iter(transport.WORKER_KEY_PREFIX + "*"):
                beat = json.loads(client.get(key) or "{}")
                if beat.get("name", "").endswith(f":{self.proc.pid}"):
                    return beat["name"]
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited: {self.log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        raise RuntimeError(f"worker not ready: {self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self in Worker.started:
            Worker.started.remove(self)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


@pytest.fixture(scope="session")
def celery_worker(stack_env, redis_client, tmp_path_factory):
    """One real Celery worker (threads pool) serving the test pairs' queues for the whole session."""
    worker = Worker(stack_env, TEST_QUEUES, tmp_path_factory.mktemp("worker") / "worker.log")
    worker.name = worker.wait_ready(redis_client)
    yield worker
    worker.stop()


@pytest.fixture(scope="session")
def live_server_url(stack_env, tmp_path_factory):
    """daphne serving the real ASGI application on a free port."""
    from inference.benchmark.servers import StackError, free_port, wait_for_port

    port = free_port()
    log_path = tmp_path_factory.mktemp("daphne") / "daphne.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                                 "chatsite.asgi:application"], cwd=ROOT, env=stack_env, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, proc)
    except StackError as exc:
        raise RuntimeError(log_path.read_text()) from exc
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def demo_pair(transactional_db):
    """The shipped demo pair, registered as `make run` registers it."""
    yield from _registered_demo_pair("--main", "small")


@pytest.fixture
def large_demo_pair(transactional_db):
    """The demo pair `make run` serves: the memory-bound main built from the committed one."""
    yield from _registered_demo_pair()


def _registered_demo_pair(*options: str):
    """The demo pair for one test; at its end, the answers the test left to the workers are stopped and end
    first: the database is emptied after each test, and on PostgreSQL a worker writing an answer meanwhile
    deadlocked with the TRUNCATE (CI saw it once)."""
    from django.core.management import call_command

    from inference.models import Generation, ModelPair
    from inference.serving.web import request_stop

    call_command("register_demo_pair", *options, stdout=io.StringIO())
    yield ModelPair.objects.get(slug="demo-code")
    # Rows a test made as RUNNING, with no worker, are not waited for: nothing runs them.
    in_flight = Generation.objects.filter(status__in=[Generation.Status.QUEUED, Generation.Status.RUNNING]).exclude(
        status=Generation.Status.RUNNING, worker="")
    for generation in in_flight:
        request_stop(generation=generation)
    deadline = time.monotonic() + 15
    while in_flight.all().exists() and time.monotonic() < deadline:  # all(): a fresh query, not the rows above
        time.sleep(0.1)


@pytest.fixture
def user(transactional_db, django_user_model):
    return django_user_model.objects.create_user(username="alice", password="alice-password")


@pytest.fixture
def other_user(transactional_db, django_user_model):
    return django_user_model.objects.create_user(username="bob", password="bob-password")


DEMO_HEAD_TOKENS = 300  # of the demo's 4,096: the main's greedy answers here write ~15% of their tokens outside them


@pytest.fixture(scope="session")
def demo_head_ids(tmp_path_factory) -> Path:
    """The demo draft's head list, made as `make real-pair` makes a real pair's (pairs/head_vocabulary.py counts a
    corpus: most of a minute), once a session, in a folder beside links to the draft's files."""
    from inference.pairs.head_vocabulary import write_head_vocabulary

    folder = tmp_path_factory.mktemp("draft")
    for source in (settings.MODELS_ROOT / settings.DEMO_PAIR_DIR / "draft").iterdir():
        (folder / source.name).symlink_to(source)
    return write_head_vocabulary(folder, size=DEMO_HEAD_TOKENS)


@pytest.fixture(scope="session")
def main_alone_greedy():
    """The main model's own greedy output (no draft, same backend and precision), computed in-process."""
    from inference.engines.decoding import DecodingParams
    from inference.engines.interface import Finished
    from inference.engines.library.pipeline import LibraryEngine
    from inference.engines.spec import PairSpec
    from inference.engines.text_assembler import TextAssembler
    from inference.limits import Route

    main_dir = settings.MODELS_ROOT / settings.DEMO_PAIR_DIR / "main"
    engine = LibraryEngine(PairSpec(slug="reference", main_dir=str(main_dir), route=Route.LIBRARY_MAIN_ALONE))
    cache: dict[tuple, str] = {}

    def run(prompt: str, max_new_tokens: int, *, add_special_tokens: bool = True) -> str:
        key = (prompt, max_new_tokens, add_special_tokens)
        if key not in cache:
            request = engine.submit(prompt=prompt, params=DecodingParams(max_new_tokens=max_new_tokens),
                                    add_special_tokens=add_special_tokens)
            text = TextAssembler(engine.tokenizer)
            while not isinstance(item := request.events.get(timeout=60), Finished):
                text.add(item.token_ids)
            text.finish()
            cache[key] = text.text
        return cache[key]

    return run


@pytest.fixture
def api_key(transactional_db):
    """An API key made as the admin makes them; the secret, shown once there, is in `.secret`."""
    from inference.api.auth import set_new_key
    from inference.models import ApiKey

    key = ApiKey(name="tests", max_concurrent=2)
    key.secret = set_new_key(key)
    key.save()
    return key


def wait_until_done(generation_id=None, *, timeout: float = 60):
    """The generation (by default the only one) once it has ended, read from the database."""
    from inference.models import Generation

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        generation = Generation.objects.filter(**({"id": generation_id} if generation_id else {})).first()
        if generation and generation.is_done:
            return generation
        time.sleep(0.1)
    raise AssertionError(f"generation {generation_id or ''} did not end")


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture
def page(live_server_url):
    """A page of Debian's headless Chromium (Playwright never downloads a browser here)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = browser.new_page()
        page.set_default_timeout(60_000)
        yield page
        browser.close()


def log_in(page, live_server_url: str, username: str, password: str, *, next_path: str = "/") -> None:
    page.goto(f"{live_server_url}/accounts/login/?next={next_path}")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server_url}{next_path}")


async def chat_socket(user, *, origin: str = "http://127.0.0.1", host: str = "127.0.0.1"):
    """The chat's websocket as a browser opens it (Origin and Host headers), logged in as `user`
    through the real session middleware; None for an anonymous one."""
    from asgiref.sync import sync_to_async
    from channels.testing import WebsocketCommunicator
    from django.test import Client

    from chatsite.asgi import application

    headers = [(b"origin", origin.encode()), (b"host", host.encode())]
    if user is not None:
        client = Client()
        await sync_to_async(client.force_login)(user)
        headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))
    return WebsocketCommunicator(application, "/ws/chat/", headers=headers)


def in_thread(query):
    """A database query while the browser runs: Playwright's sync API keeps an event loop in the test's
    thread, where Django refuses synchronous queries."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(query).result()
