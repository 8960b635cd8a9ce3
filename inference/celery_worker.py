"""The Celery worker command line, written once: `manage.py serve`, the benchmark's stack, the test
suite and the hints shown to users all start (or tell how to start) a worker the same way."""

from __future__ import annotations

import shlex
import sys

# Threads, not prefork: one process holds the pipelines and its step threads; tasks are thin readers.
POOL = "threads"


def worker_command(*, queues: list[str], concurrency: int | None = None, name: str = "",
                   loglevel: str = "INFO") -> list[str]:
    """argv for a worker consuming `queues`, run by this Python. Without mingle and gossip: workers learn
    of each other from the product's heartbeats (serving/lifecycle.py), and Celery's fan-out crashed
    workers on a Redis restart (see CELERY_WORKER_ENABLE_REMOTE_CONTROL)."""
    argv = [sys.executable, "-m", "celery", "-A", "chatsite", "worker", "-P", POOL, "-Q", ",".join(queues)]
    if concurrency:
        argv += ["-c", str(concurrency)]
    if name:
        argv += ["-n", name]
    return [*argv, "--without-mingle", "--without-gossip", "--loglevel", loglevel]


def worker_command_line(*, queues: list[str]) -> str:
    """The command a user types to serve `queues` (shown in errors and the admin)."""
    return shlex.join(["celery", *worker_command(queues=queues)[3:-2]])
