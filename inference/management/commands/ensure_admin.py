import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the local admin account if there is none (SPECCHAT_ADMIN_USER / SPECCHAT_ADMIN_PASSWORD)."

    def handle(self, *args, **options):
        username = os.environ.get("SPECCHAT_ADMIN_USER", "admin")
        password = os.environ.get("SPECCHAT_ADMIN_PASSWORD", "admin")
        User = get_user_model()
        if User.objects.filter(username=username).exists():
            self.stdout.write(f"log in as '{username}' (existing account)")
            return
        User.objects.create_superuser(username=username, email="", password=password)
        self.stdout.write(f"log in as '{username}' with password '{password}' (change it in the admin)")
