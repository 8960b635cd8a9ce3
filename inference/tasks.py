"""Celery tasks: thin, run in the worker process. The web side sends them by name (never imports
this module's dependencies); each imports its worker-side service where it runs."""

from celery import shared_task


@shared_task(name="inference.generate")
def generate(generation_id: str) -> None:
    """One generation on this worker's engine for the pair (the task is routed to the pair's queue)."""
    from inference.serving import lifecycle, worker

    worker.run_generation(generation_id=generation_id, worker_name=lifecycle.WORKER_NAME)


@shared_task(name="inference.import_pair")
def import_pair(job_id: int) -> None:
    """An import queued from the admin, on the control queue; progress and errors land on the ImportJob."""
    from inference.pairs import importer

    importer.run_queued_import(job_id=job_id)


@shared_task(name="inference.benchmark")
def benchmark(run_id: int) -> None:
    """A benchmark of a pair on this worker's own engines (the task is routed to the pair's queue)."""
    from inference.benchmark import runs

    runs.execute_benchmark_run(run_id=run_id)
