"""A pair's benchmark runs kept in the database, for its admin page: one `manage.py benchmark` finished
(`record_run`), or one the admin queued (`start_benchmark_run`), which a worker of the pair's queue measures
in-process on its own loaded engines (`execute_benchmark_run`); and a finished run's plots."""

import logging
import time
from pathlib import Path

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from inference import jobs
from inference.benchmark import report
from inference.benchmark.runs import BenchmarkOptions, benchmark_engines, run_benchmark
from inference.models import BenchmarkRun, ModelPair

log = logging.getLogger(__name__)


def record_run(*, pair: ModelPair, options: BenchmarkOptions, results: dict, report_dir: Path) -> BenchmarkRun:
    """Keep a finished run (from the command) so the pair's admin page shows it."""
    return BenchmarkRun.objects.create(pair=pair, status=BenchmarkRun.Status.FINISHED, options=options.as_json(),
                                       results=results, report_dir=str(report_dir.resolve()), progress="done",
                                       finished_at=timezone.now())


def start_benchmark_run(*, pair: ModelPair, options: BenchmarkOptions) -> BenchmarkRun:
    """Record a queued run and send it to a worker of the pair's queue."""
    run = BenchmarkRun.objects.create(pair=pair, options=options.as_json())
    transaction.on_commit(lambda: current_app.send_task("inference.benchmark", args=[run.id], queue=pair.queue))
    return run


def _failure(exc: Exception) -> str:
    """The run's error as the admin shows it: a timeout's own sentence, else the exception named."""
    return str(exc) if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"


def execute_benchmark_run(*, run_id: int) -> None:
    """The worker's side: measure in-process on this worker's own engines for the pair (shared
    with any live traffic, which the notes say), write the report, keep the results."""
    from inference.serving.worker import STATE

    if not jobs.claim(model=BenchmarkRun, job_id=run_id):
        return  # a replayed delivery of a run that already started
    run = BenchmarkRun.objects.select_related("pair").get(id=run_id)
    last_update = 0.0

    def progress(done: int, total: int, label: str) -> None:
        nonlocal last_update
        if time.monotonic() - last_update >= 2:
            last_update = time.monotonic()
            BenchmarkRun.objects.filter(id=run_id).update(progress=f"{done}/{total}: {label}")

    try:
        with jobs.leased(model=BenchmarkRun, job_id=run_id):
            options = BenchmarkOptions.from_json(run.options)
            engines, baseline = benchmark_engines(pair=run.pair, get=STATE.engines.get)
            results = run_benchmark(pair=run.pair, options=options, progress=progress, engines=engines, notes=(
                baseline, "Run on a worker's own engines, which live traffic may have shared."))
            report_dir = Path(settings.BENCHMARK_DIR) / f"{run.pair.slug}-{run.id}"
            report.write_report(results, report_dir)
    except Exception as exc:
        log.exception("benchmark run %s failed", run_id)
        BenchmarkRun.objects.filter(id=run_id).update(status=BenchmarkRun.Status.FAILED, finished_at=timezone.now(),
                                                      error=_failure(exc))
        return
    BenchmarkRun.objects.filter(id=run_id).update(status=BenchmarkRun.Status.FINISHED, results=results,
                                                  report_dir=str(report_dir), progress="done",
                                                  finished_at=timezone.now())


def latest_finished_run(*, pair: ModelPair) -> BenchmarkRun | None:
    return pair.benchmarks.filter(status=BenchmarkRun.Status.FINISHED).order_by("-created_at").first()


def plot_file(*, run: BenchmarkRun, name: str) -> Path | None:
    """One of the run's PNGs, if it has it (names are checked against the known plots)."""
    if name not in report.PLOTS or not run.report_dir:
        return None
    path = Path(run.report_dir) / name
    return path if path.is_file() else None
