import os
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = ("Create the local admin account if there is none (SPECCHAT_ADMIN_USER / SPECCHAT_ADMIN_PASSWORD). "
            "Without a password: admin/admin with DEBUG on (a developer's machine), else a random one, shown once.")

    def handle(self, *args, **options):
        username = os.environ.get("SPECCHAT_ADMIN_USER", "admin")
        User = get_user_model()
        if User.objects.filter(username=username).exists():
            self.stdout.write(f"log in as '{username}' (existing account)")
            return
        given = os.environ.get("SPECCHAT_ADMIN_PASSWORD", "")
        if given:
            password, note = given, "the password given"
        elif settings.DEBUG:
            password, note = "admin", "password 'admin' (change it in the admin)"
        else:  # never a default password outside DEBUG
            password = secrets.token_urlsafe(18)
            note = f"password '{password}', generated and shown only now"
        User.objects.create_superuser(username=username, email="", password=password)
        self.stdout.write(f"log in as '{username}' with {note}")
