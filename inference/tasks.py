"""Every Celery task a worker runs (Celery finds them through this module): thin, each imports its worker-side
service in its body, where it runs. The generation's own task lives beside the generation path
(serving/tasks.py), which sends it; the admin's jobs are sent by name."""

from celery import shared_task

from inference.serving.tasks import generate

__all__ = ["benchmark", "calibrate", "generate", "import_pair"]


@shared_task(name="inference.import_pair")
def import_pair(job_id: int) -> None:
    """An import queued from the admin, on the control queue; progress and errors land on the ImportJob."""
    from inference.pairs import importer

    importer.run_queued_import(job_id=job_id)


@shared_task(name="inference.benchmark")
def benchmark(run_id: int) -> None:
    """A benchmark of a pair on this worker's own engines (the task is routed to the pair's queue)."""
    from inference.benchmark import records

    records.execute_benchmark_run(run_id=run_id)


@shared_task(name="inference.calibrate")
def calibrate(calibration_id: int) -> None:
    """A pair's calibration on this worker's host (the task is routed to the pair's queue)."""
    from inference.calibration import runs

    runs.execute_calibration(calibration_id=calibration_id)
