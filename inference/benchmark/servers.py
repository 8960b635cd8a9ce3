"""The servers a benchmark starts for itself, and the user it logs in as.

`local_stack` runs daphne and Celery workers as `manage.py serve` does, against this machine's
Redis, for the speed benchmark. `private_stack` runs the soak's own redis-server (a free port, no
persistence, so a restart loses everything as a real one would; the machine's Redis is never
touched), two workers with short heartbeats and daphne, so faults can be injected without harm.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path

import redis
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model

from inference import selectors, transport
from inference.api.auth import set_new_key
from inference.benchmark import memory
from inference.benchmark.outages import STACK_APPLICATION_NAME
from inference.celery_worker import worker_command
from inference.limits import ServingState
from inference.models import ApiKey, ModelPair

BENCHMARK_USERNAME = "specchat-benchmark"  # has no password: only the benchmark logs in as it


class StackError(Exception):
    """The stack could not be started or reached."""


# ------------------------------------------------------------------ credentials
@dataclass(frozen=True)
class Credentials:
    user_id: int
    session_cookie: str  # "name=value" of a logged-in session, for the websocket
    api_key: str  # a Bearer key, for the REST API


def open_session(*, user_id: int) -> str:
    """The key of a new logged-in session of the user, made without a password."""
    user = get_user_model().objects.get(pk=user_id)
    store = import_module(settings.SESSION_ENGINE).SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[-1]  # the one that loads users (axes only guards)
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.create()
    return store.session_key


def close_session(key: str) -> None:
    import_module(settings.SESSION_ENGINE).SessionStore(session_key=key).delete()


def session_cookie(key: str) -> str:
    return f"{settings.SESSION_COOKIE_NAME}={key}"


@contextmanager
def stack_credentials(*, max_concurrent: int) -> Iterator[Credentials]:
    """A logged-in session and an API key of the `benchmark` user (who cannot log in with a
    password); both, and the user's conversations, are removed afterwards."""
    user = get_user_model().objects.filter(username=BENCHMARK_USERNAME).first()
    if user is None:
        user = get_user_model()(username=BENCHMARK_USERNAME)
        user.set_unusable_password()
        user.save()
    elif user.has_usable_password():
        raise StackError(f"a user '{BENCHMARK_USERNAME}' with a password exists; the benchmark will not use it")
    session = open_session(user_id=user.pk)
    api_key = ApiKey(name="benchmark", user=user, max_concurrent=max_concurrent)
    key = set_new_key(api_key)
    api_key.save()
    try:
        yield Credentials(user_id=user.pk, session_cookie=session_cookie(session), api_key=key)
    finally:
        api_key.delete()
        close_session(session)
        user.conversations.all().delete()


# ------------------------------------------------------------------ the stack
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def check_served(*, pair: ModelPair) -> None:
    """StackError unless a live worker serves (or is loading) the pair."""
    state = selectors.pair_state(pair=pair, workers=selectors.live_workers(client=transport.sync_client()))
    if not state.served:
        raise StackError(f"nobody serves '{pair.slug}': {state.error}")


def wait_until_served(*, pair: ModelPair, worker_pid: int, timeout: float = 180) -> None:
    """Until this worker reports the pair AVAILABLE (it loads its queues' pairs at start)."""
    client = transport.sync_client()
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        workers = [w for w in selectors.live_workers(client=client) if w.get("name", "").endswith(f":{worker_pid}")]
        state = selectors.pair_state(pair=pair, workers=workers)
        if state.state == ServingState.AVAILABLE:
            return
        if state.state == ServingState.UNAVAILABLE and workers:
            raise StackError(f"'{pair.slug}' cannot be served: {state.error}")
        time.sleep(0.3)
    raise StackError(f"'{pair.slug}' was not served within {timeout:.0f} s ({state.error if state else 'no state'})")


def start_worker(*, logs: Path, index: int, name: str, pair: ModelPair, threads: int, env: dict[str, str]
                 ) -> subprocess.Popen:
    """A Celery worker of the pair's queue named `name` (with `%h`), writing to logs/worker<index>.log; its heartbeat
    says its `threads` slots (routing reroutes a turn unclaimed by a worker it believes has a free one)."""
    log = open(logs / f"worker{index}.log", "a")  # noqa: SIM115 - the worker writes to it until it ends
    return subprocess.Popen(worker_command(queues=[pair.queue], concurrency=threads, name=name, loglevel="WARNING"),
                            cwd=settings.BASE_DIR, env={**env, "SPECCHAT_WORKER_SLOTS": str(threads)}, stdout=log,
                            stderr=subprocess.STDOUT)


def terminate(procs: list[subprocess.Popen], *, timeout: float = 30) -> None:
    """SIGTERM to each, then SIGKILL to any not gone within `timeout`."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()


@dataclass
class LocalStack:
    """The benchmark's daphne and Celery workers of one pair (see `local_stack`). A conversation benchmark stops the
    worker holding a conversation between two turns, as systemd stops a service (`stop_holder`), and starts it again
    for the next conversation (`restart_stopped`)."""

    pair: ModelPair
    env: dict[str, str]
    logs: Path
    worker_threads: int
    url: str = ""
    workers: list[subprocess.Popen] = field(default_factory=list)
    stopped: dict[int, signal.Signals] = field(default_factory=dict)  # workers stopped and not started again

    def start_worker(self, index: int) -> subprocess.Popen:
        proc = start_worker(logs=self.logs, index=index, name=f"benchmark{index}-{os.getpid()}@%h", pair=self.pair,
                            threads=self.worker_threads, env=self.env)
        self.workers[index:index + 1] = [proc]
        return proc

    def stop_holder(self, worker: str, *, sig: signal.Signals = signal.SIGTERM) -> None:
        """Signal the worker named `worker` ("host:pid", as the records name it), once; the next turn is sent
        without waiting for it to exit."""
        for index, proc in enumerate(self.workers):
            if worker.endswith(f":{proc.pid}") and index not in self.stopped:
                self.stopped[index] = sig
                proc.send_signal(sig)

    def restart_stopped(self) -> None:
        """Every stopped worker started again, each once it has exited (a frozen one killed), and serving before this
        returns."""
        for index, sig in sorted(self.stopped.items()):
            if sig == signal.SIGSTOP:
                self.workers[index].kill()
            try:
                self.workers[index].wait(60)
            except subprocess.TimeoutExpired:
                self.workers[index].kill()
                self.workers[index].wait(10)
            wait_until_served(pair=self.pair, worker_pid=self.start_worker(index).pid)
        self.stopped.clear()


@contextmanager
def local_stack(*, pair: ModelPair, worker_threads: int, prefix_caching: bool = False, workers: int = 1
                ) -> Iterator[str]:
    """daphne and `workers` Celery workers for the pair's queue (as `manage.py serve` runs one) on a free port; yields
    the base URL (`local_workers`)."""
    with local_workers(pair=pair, worker_threads=worker_threads, prefix_caching=prefix_caching,
                       workers=workers) as stack:
        yield stack.url


@contextmanager
def local_workers(*, pair: ModelPair, worker_threads: int, prefix_caching: bool = False, workers: int = 1
                  ) -> Iterator[LocalStack]:
    """daphne and `workers` Celery workers for the pair's queue on a free port, with this process's settings (engines
    not renewed). Refuses to start while another worker takes the pair's queue, since it would take part of the load.
    The one-turn lines keep no prefix cache (every variant prefills every prompt, as a user's new one); the
    conversations keep one."""
    others = selectors.pair_state(pair=pair, workers=selectors.live_workers(client=transport.sync_client())).workers
    if others:
        raise StackError(f"worker(s) {', '.join(others)} already serve {pair.queue}: stop them, or benchmark "
                         f"that server with --url")
    root = Path(settings.BASE_DIR)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "chatsite.settings"),
           "SPECCHAT_PREFIX_CACHING": "1" if prefix_caching else "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH", "")])),
           "SPECCHAT_CHAT_MAX_CONCURRENT": str(worker_threads),  # the benchmark user's websocket sweep, as its key
           # No engine renewal within the run: a pipeline built mid-run takes the cores for seconds and
           # would be charged to whichever line ran then (the soak covers renewals).
           "SPECCHAT_ENGINE_RENEW_AFTER_REQUESTS": "0"}
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="specchat-bench-") as logs:
        stack = LocalStack(pair=pair, env=env, logs=Path(logs), worker_threads=worker_threads,
                           url=f"http://127.0.0.1:{port}")
        web_log = Path(logs, "daphne.log")
        daphne = None
        try:
            for index in range(workers):
                stack.start_worker(index)
            with open(web_log, "w") as dl:
                daphne = subprocess.Popen(
                    [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "chatsite.asgi:application"],
                    cwd=root, env=env, stdout=dl, stderr=subprocess.STDOUT)
            try:
                wait_for_port(port, daphne)
                for worker in stack.workers:
                    wait_until_served(pair=pair, worker_pid=worker.pid)
            except StackError as exc:
                logs_tail = "".join(f"--- {path.name}\n{_tail(path)}\n" for path in sorted(Path(logs).glob("*.log")))
                raise StackError(f"{exc}\n{logs_tail}") from exc
            yield stack
        finally:
            terminate([*stack.workers, *([daphne] if daphne else [])])


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if proc.poll() is not None:
                raise StackError("daphne exited") from None
            time.sleep(0.2)
    raise StackError(f"daphne did not listen on port {port} within {timeout:.0f} s")


# ------------------------------------------------------------------ the soak's private stack
class PrivateRedis:
    """A redis-server of the soak's own on a free port, without persistence."""

    def __init__(self, workdir: Path):
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True)

    def start(self) -> None:
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(self.workdir)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with suppress(redis.ConnectionError):
                if self.client().ping():
                    return
            time.sleep(0.05)
        raise StackError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def restart(self, *, down_s: float = 1.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()


@dataclass
class PrivateStack:
    base_url: str
    redis: PrivateRedis
    env: dict[str, str]
    pair: ModelPair
    logs: Path
    workers: list[subprocess.Popen] = field(default_factory=list)
    threads: int = 8
    # Workers that exited without being killed by the soak (Celery's Redis transport can give up when
    # Redis restarts) are started again, as compose's restart policy does; each is counted and reported.
    unplanned_exits: list[str] = field(default_factory=list)
    _killing: set[int] = field(default_factory=set)
    _stopping: threading.Event = field(default_factory=threading.Event)

    def supervise(self) -> None:
        while not self._stopping.wait(0.5):
            for index, proc in enumerate(list(self.workers)):
                if proc.poll() is not None and index not in self._killing:
                    self.unplanned_exits.append(f"worker {index} (pid {proc.pid}) exited with {proc.returncode}")
                    self.start_worker(index)

    def start_worker(self, index: int) -> subprocess.Popen:
        proc = start_worker(logs=self.logs, index=index, name=f"soak{index}-{os.getpid()}@%h", pair=self.pair,
                            threads=self.threads, env=self.env)
        self.workers[index:index + 1] = [proc]
        return proc

    def wait_served(self, proc: subprocess.Popen, timeout: float = 180) -> None:
        """Until the worker announces the pair AVAILABLE on the private Redis."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            workers = [w for w in selectors.live_workers(client=self.redis.client())
                       if w.get("name", "").endswith(f":{proc.pid}")]
            if selectors.pair_state(pair=self.pair, workers=workers).state == ServingState.AVAILABLE:
                return
            if proc.poll() is not None:
                raise StackError(f"worker {proc.pid} exited")
            time.sleep(0.3)
        raise StackError(f"worker {proc.pid} did not serve '{self.pair.slug}' within {timeout:.0f} s")

    def kill_worker(self, index: int) -> None:
        self._killing.add(index)
        self.workers[index].send_signal(signal.SIGKILL)
        self.workers[index].wait(10)

    def restart_killed_worker(self, index: int) -> None:
        self.wait_served(self.start_worker(index))
        self._killing.discard(index)

    def freeze_steps(self, index: int, *, seconds: float) -> None:
        """Stop a worker's step processes (SIGSTOP) for `seconds`, then let them go on. A worker whose engines run in
        its own process (the own engine) is stopped whole, its heartbeat with them: a frozen machine, and answers
        stopped mid-verify whose blocks must come back once it goes on."""
        steps = memory.process_tree(self.workers[index].pid)[1:] or [self.workers[index].pid]
        for pid in steps:
            os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            for pid in steps:
                with suppress(ProcessLookupError):  # killed meanwhile by the worker's watchdog
                    os.kill(pid, signal.SIGCONT)

    def pss_mb(self, index: int) -> tuple[int, float]:
        """(pid, PSS in MB) of a worker with its step processes (the pipelines live there); 0 MB if gone."""
        pid = self.workers[index].pid
        return pid, sum(memory.tree_pss(pid).values()) / 2**20


@contextmanager
def private_stack(*, pair: ModelPair, base_env: dict[str, str], workers: int = 2, threads: int = 8,
                  stream_ttl_s: int = 15, chat_max_concurrent: int = 16, kv_pool_mb: int = 64
                  ) -> Iterator[PrivateStack]:
    """Redis, `workers` Celery workers for the pair and daphne, all the soak's own; short heartbeats
    and requeue delays so a fault shows within seconds."""
    with tempfile.TemporaryDirectory(prefix="specchat-soak-") as tmp:
        logs = Path(tmp)
        private_redis = PrivateRedis(logs)
        env = {**base_env, "REDIS_URL": private_redis.url, "CELERY_BROKER_URL": private_redis.url,
               "SPECCHAT_TEST_REDIS_URL": private_redis.url,  # where tests.settings takes Redis from
               "SPECCHAT_WORKER_HEARTBEAT_S": "1", "SPECCHAT_WORKER_HEARTBEAT_TTL_S": "3",
               "SPECCHAT_REQUEUE_AFTER_S": "3", "SPECCHAT_STREAM_TTL_S": str(stream_ttl_s),
               "SPECCHAT_CHAT_MAX_CONCURRENT": str(chat_max_concurrent), "SPECCHAT_CHAT_ABANDON_GRACE_S": "5",
               # a small KV pool: the blocks a soak's answers leave cached count in the worker's memory, up to this
               "SPECCHAT_KV_POOL_MB": str(kv_pool_mb),
               "PGAPPNAME": STACK_APPLICATION_NAME,  # a database outage ends these connections, not the soak's own
               "PYTHONPATH": os.pathsep.join(filter(None, [str(settings.BASE_DIR), base_env.get("PYTHONPATH")]))}
        port = free_port()
        stack = PrivateStack(base_url=f"http://127.0.0.1:{port}", redis=private_redis, env=env, pair=pair,
                             logs=logs, threads=threads)
        with open(logs / "daphne.log", "w") as daphne_log:
            daphne = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                                       "chatsite.asgi:application"], cwd=settings.BASE_DIR, env=env,
                                      stdout=daphne_log, stderr=subprocess.STDOUT)
        try:
            for index in range(workers):
                stack.start_worker(index)
            wait_for_port(port, daphne)
            for proc in stack.workers:
                stack.wait_served(proc)
            threading.Thread(target=stack.supervise, name="soak-supervisor", daemon=True).start()
            yield stack
        except StackError as exc:
            tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in logs.glob("*.log"))
            raise StackError(f"{exc}\n{tails}") from exc
        finally:
            stack._stopping.set()
            terminate([*stack.workers, daphne], timeout=20)
            private_redis.stop()
