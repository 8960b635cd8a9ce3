import os

from celery import Celery
from celery.signals import worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

app = Celery("chatsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["inference"])


@worker_init.connect
def load_the_worker_side(**_) -> None:
    """Only a worker imports its side (engines, heartbeat, control commands): web processes never do."""
    from inference.serving import lifecycle

    lifecycle.register()
