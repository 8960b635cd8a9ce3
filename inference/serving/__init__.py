"""The generation path. `web` runs in the Django process (daphne): it validates, records and queues
a generation and follows its stream. `worker` and `lifecycle` run in the Celery worker process: they
hold the engines, run generations and announce the worker. `records` is what both sides write.
The web side never imports the worker side; tasks are sent by name."""
