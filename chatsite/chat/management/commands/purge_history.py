from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from chatsite.chat.services import purge_history


class Command(BaseCommand):
    help = ("Delete chat history and API answers older than SPECCHAT_RETENTION_DAYS (or --days); run it daily "
            "from cron or a scheduler. 0 days keeps everything.")

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, default=settings.RETENTION_DAYS)

    def handle(self, *args, days: int, **options):
        if days < 0:
            raise CommandError("--days must be 0 (keep everything) or more.")
        if days == 0:
            self.stdout.write("Retention is off (0 days): nothing deleted.")
            return
        conversations, generations = purge_history(older_than_days=days)
        self.stdout.write(f"Deleted {conversations} conversation(s) and {generations} other answer(s) "
                          f"older than {days} day(s).")
