from celery import shared_task

from inference import importer, services, workers


@shared_task(name="inference.generate")
def generate(generation_id: str) -> None:
    """One generation on this worker's engine for the pair (the task is routed to the pair's queue)."""
    services.run_generation(generation_id=generation_id, worker_name=workers.WORKER_NAME)


@shared_task(name="inference.import_pair")
def import_pair(job_id: int) -> None:
    """An import queued from the admin, on the control queue; progress and errors land on the ImportJob."""
    importer.run_queued_import(job_id=job_id)


@shared_task(name="inference.benchmark")
def benchmark(run_id: int) -> None:
    """A benchmark of a pair on this worker's own engines (the task is routed to the pair's queue)."""
    from inference import benchmark_runs

    benchmark_runs.execute_benchmark_run(run_id=run_id)
