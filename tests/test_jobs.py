"""Background jobs (imports, benchmark runs) never stay `running` without a worker: the worker running a
job renews its lease, a live worker's heartbeat fails a job whose lease ran out (and removes what an
import left half-written), and a second delivery of a job that is running leaves it alone. Real
workers, the real database."""

import shutil
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from inference import jobs
from inference.models import BenchmarkRun, ImportJob
from inference.pairs.importer import run_queued_import

pytestmark = pytest.mark.django_db(transaction=True)


def staging_of(slug: str):
    folder = settings.MODELS_ROOT / f".import-{slug}-test"
    folder.mkdir()
    (folder / "openvino_model.bin").write_bytes(b"half-written")
    return folder


def test_a_job_whose_worker_stopped_is_failed_by_a_live_workers_heartbeat(celery_worker, demo_pair):
    expired = timezone.now() - timedelta(seconds=1)
    job = ImportJob.objects.create(name="orphan", slug="orphan-import", main_source="x", status="running",
                                   lease_until=expired)
    run = BenchmarkRun.objects.create(pair=demo_pair, status="running", lease_until=expired)
    staging = staging_of(job.slug)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and ImportJob.objects.get(pk=job.pk).status == "running":
            time.sleep(0.2)
        job.refresh_from_db()
        run.refresh_from_db()
        assert (job.status, job.error) == ("failed", jobs.ABANDONED)
        assert (run.status, run.error) == ("failed", jobs.ABANDONED) and run.finished_at
        assert not staging.exists(), "the import's half-written export was left behind"
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def test_a_second_delivery_of_a_running_import_leaves_it_alone():
    job = ImportJob.objects.create(name="busy", slug="busy-import", main_source="x")
    assert jobs.claim(model=ImportJob, job_id=job.pk)  # the first delivery, on a worker that is alive
    staging = staging_of(job.slug)
    try:
        run_queued_import(job_id=job.pk)  # the broker handed the task out again
        job.refresh_from_db()
        assert job.status == "running" and not job.error
        assert staging.exists(), "the second delivery removed the live import's export"
        jobs.fail_abandoned(model=ImportJob)  # a heartbeat meanwhile: the lease holds
        assert ImportJob.objects.get(pk=job.pk).status == "running"
    finally:
        shutil.rmtree(staging)


def test_the_lease_is_renewed_while_the_job_runs(monkeypatch):
    monkeypatch.setattr(jobs, "RENEW_EVERY_S", 0.2)
    job = ImportJob.objects.create(name="long", slug="long-import", main_source="x")
    assert jobs.claim(model=ImportJob, job_id=job.pk)
    first = ImportJob.objects.get(pk=job.pk).lease_until
    with jobs.leased(model=ImportJob, job_id=job.pk):
        time.sleep(1.0)
        renewed = ImportJob.objects.get(pk=job.pk).lease_until
    assert renewed > first
    assert not jobs.claim(model=ImportJob, job_id=job.pk), "a running job was claimed twice"
