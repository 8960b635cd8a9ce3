"""Test settings: the real settings, with Redis and the database kept apart from a running dev server."""

import os

os.environ.setdefault("SPECCHAT_STALL_TIMEOUT_S", "8")
os.environ.setdefault("SPECCHAT_REQUEUE_AFTER_S", "3")
# Production defaults (DEBUG off), with a secret of the tests' own; also for daphne and the workers they start.
os.environ["DJANGO_DEBUG"] = "0"
os.environ.setdefault("DJANGO_SECRET_KEY", "tests-only-" + "k" * 50)
os.environ.setdefault("SPECCHAT_ACCESS_RECHECK_S", "1")
os.environ.setdefault("SPECCHAT_CHAT_ABANDON_GRACE_S", "1")
os.environ.setdefault("SPECCHAT_METRICS_OPEN", "1")  # the API tests read /metrics as a scraper inside would
# Always a Redis DB of its own: the tests flush it, and `make run` keeps its data in DB 0.
os.environ["REDIS_URL"] = os.environ.get(
    "SPECCHAT_TEST_REDIS_URL", f"redis://127.0.0.1:6379/{os.environ.get('SPECCHAT_TEST_REDIS_DB', '15')}")

from chatsite.settings import *
from chatsite.settings import DATABASES, VAR_DIR

# A file, not an in-memory database: the Celery worker and daphne run as separate processes.
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    VAR_DIR.mkdir(parents=True, exist_ok=True)  # absent in a fresh checkout
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-{os.environ.get('SPECCHAT_TEST_REDIS_DB', '15')}.sqlite3")}
    DATABASES["default"]["OPTIONS"] = {**DATABASES["default"].get("OPTIONS", {}),  # WAL, as served
                                       "timeout": int(os.environ.get("SPECCHAT_TEST_DB_TIMEOUT_S", "30"))}
elif "SPECCHAT_TEST_REDIS_DB" in os.environ and "TEST" not in DATABASES["default"]:
    # Sessions sharing one PostgreSQL keep their test databases apart (else pytest-django's test_<NAME>).
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_{os.environ['SPECCHAT_TEST_REDIS_DB']}"}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
