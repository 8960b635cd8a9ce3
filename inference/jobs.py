"""The lease a worker holds on the background job it runs (an import, a benchmark run).

A job's task can arrive twice (the broker hands an unacknowledged task out again after its visibility
timeout, or when its worker's connection dropped) and a worker can die in the middle of a job. So a
worker claims a queued job, renews its lease while the job runs, and every worker's heartbeat fails the
jobs whose lease ran out: no job stays `running` without a worker, and a second delivery of a job that
is running leaves it alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import TypeVar

from django.db import DatabaseError, close_old_connections
from django.db.models import Q
from django.utils import timezone

from inference.models import BenchmarkRun, HostCalibration, ImportJob, JobStatus

log = logging.getLogger(__name__)

LEASE_S = 120  # a job not renewed for this long lost its worker
RENEW_EVERY_S = 20
ABANDONED = "The worker running this job stopped; start it again."
J = TypeVar("J", BenchmarkRun, HostCalibration, ImportJob)


def claim(*, model: type[J], job_id: int) -> bool:
    """Take a queued job: False if it already started or ended (another delivery of the same task)."""
    return bool(model.objects.filter(pk=job_id, status=JobStatus.QUEUED).update(
        status=JobStatus.RUNNING, lease_until=_lease_end()))


@contextmanager
def leased(*, model: type[J], job_id: int) -> Iterator[None]:
    """Renew the job's lease from a thread of its own while the block runs (a job's long steps, such as
    an export, give no chance to renew it in between)."""
    done = threading.Event()

    def renew() -> None:
        while not done.wait(RENEW_EVERY_S):
            try:
                model.objects.filter(pk=job_id, status=JobStatus.RUNNING).update(lease_until=_lease_end())
            except DatabaseError:  # the next renewal tries again; the lease outlasts a few misses
                log.warning("could not renew the lease of %s %s", model.__name__, job_id, exc_info=True)
            finally:
                with suppress(DatabaseError):  # a broken connection is dropped here or on next use
                    close_old_connections()

    renewer = threading.Thread(target=renew, name=f"lease-{model.__name__}-{job_id}", daemon=True)
    renewer.start()
    try:
        yield
    finally:
        done.set()
        renewer.join(timeout=5)


def fail_abandoned(*, model: type[J]) -> list[J]:
    """Fail the running jobs whose lease ran out, and return them."""
    now = timezone.now()
    failed = []
    expired = Q(lease_until__lt=now) | Q(lease_until__isnull=True)  # null: started before leases existed
    for job in model.objects.filter(expired, status=JobStatus.RUNNING):
        if model.objects.filter(expired, pk=job.pk, status=JobStatus.RUNNING).update(
                status=JobStatus.FAILED, error=ABANDONED, finished_at=now):
            failed.append(job)
    return failed


def _lease_end():
    return timezone.now() + timedelta(seconds=LEASE_S)
