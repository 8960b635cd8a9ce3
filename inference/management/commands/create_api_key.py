"""Create a REST API key from a script: `KEY=$(python manage.py create_api_key --name ci)`."""

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from inference.api.auth import set_new_key
from inference.models import ApiKey

MAX_CONCURRENT = ApiKey._meta.get_field("max_concurrent")


class Command(BaseCommand):
    help = ("Create an API key and print its secret on stdout, once: only its hash is stored. "
            "Revoke it in the admin (API keys).")

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True, help="What the key is for, as the admin lists it.")
        parser.add_argument("--user", help="Username of the key's owner (optional).")
        parser.add_argument("--max-concurrent", type=int, default=MAX_CONCURRENT.default,
                            help=f"Generations in flight at once; more answer 429 (default {MAX_CONCURRENT.default}).")

    def handle(self, *args, name: str, user: str | None, max_concurrent: int, **options):
        owner = None
        if user:
            users = get_user_model()
            owner = users.objects.filter(**{users.USERNAME_FIELD: user}).first()
            if owner is None:
                raise CommandError(f"No user {user!r}: nobody has that username.")
        if not 1 <= max_concurrent <= 32767:
            raise CommandError("--max-concurrent must be between 1 and 32767.")
        key = ApiKey(name=name, user=owner, max_concurrent=max_concurrent)
        secret = set_new_key(key)
        try:
            key.full_clean()
        except ValidationError as exc:
            raise CommandError("; ".join(f"{field}: {' '.join(errors)}"
                                         for field, errors in exc.message_dict.items())) from None
        key.save()
        self.stderr.write(f"API key '{name}' created ({key.prefix}…); its secret, shown this once:")
        self.stdout.write(secret)
