import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inference.celery_worker import worker_command
from inference.models import ModelPair
from inference.pairs import importer


class Command(BaseCommand):
    help = "Run the whole product on this machine: a Celery worker for every enabled pair, and daphne."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--pair", default="", help="Serve this pair alone, as the chat's default.")

    def handle(self, *args, host: str, port: int, pair: str, **options):
        pairs = ModelPair.objects.filter(enabled=True)
        if pair:
            chosen = pairs.filter(slug=pair).first()
            if chosen is None:
                known = ", ".join(pairs.values_list("slug", flat=True)) or "none"
                raise CommandError(f"No enabled pair '{pair}' (registered: {known}); the real pair is installed by "
                                   "`make real-pair`.")
            chosen.is_default = True
            chosen.save(update_fields=["is_default"])
            pairs = pairs.filter(pk=chosen.pk)
        queues = [p.queue for p in pairs] or ["pair.none"]
        if importer.can_export():
            queues.append(settings.CONTROL_QUEUE)  # the train extra is here: take the admin's imports too
        command = worker_command(queues=queues, concurrency=settings.WORKER_SLOTS)
        worker = subprocess.Popen(command)
        web = subprocess.Popen([sys.executable, "-m", "daphne", "-b", host, "-p", str(port),
                                "chatsite.asgi:application"])
        self.stdout.write(self.style.SUCCESS(
            f"\nSpecChat is up at http://{host}:{port}/  (admin: http://{host}:{port}/admin/)\n"
            f"Worker queues: {', '.join(queues)}. Ctrl-C stops both.\n"))
        signal.signal(signal.SIGTERM, lambda *_: web.terminate())
        try:
            # A worker can exit on its own (Celery's Redis transport may give up when Redis restarts):
            # started again, as compose's restart policy does; its answers in flight were failed meanwhile.
            while web.poll() is None:
                if worker.poll() is not None:
                    self.stderr.write(f"the worker exited ({worker.returncode}): starting it again")
                    worker = subprocess.Popen(command)
                time.sleep(1)
        except KeyboardInterrupt:
            pass
        finally:
            for proc in (web, worker):
                proc.terminate()
            for proc in (web, worker):
                proc.wait(30)
