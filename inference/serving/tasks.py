"""The generation's Celery task. The web side (serving.web) sends it through this object once the record is
committed; a worker runs it. Its body imports the worker side where it runs, so the web side imports this
module and none of the worker's."""

from celery import shared_task


@shared_task(name="inference.generate")
def generate(generation_id: str) -> None:
    """One generation on this worker's engine for the pair (the task is routed to the pair's queue)."""
    from inference.serving import worker

    worker.run_generation(generation_id=generation_id, worker_name=worker.WORKER_NAME)
