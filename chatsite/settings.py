"""All settings, read from the environment with defaults that work on a developer's machine."""

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    return os.environ.get(name, str(default)).lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


# Off unless asked for (`make run` asks): a server started without settings must not show tracebacks.
DEBUG = env_bool("DJANGO_DEBUG", False)
DEV_SECRET_KEY = "dev-only-insecure-key-change-me"
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or (DEV_SECRET_KEY if DEBUG else "")
if not SECRET_KEY or (not DEBUG and SECRET_KEY == DEV_SECRET_KEY):
    raise ImproperlyConfigured(
        "Set DJANGO_SECRET_KEY to a secret of your own (or DJANGO_DEBUG=1 on a developer's machine).")
# Django's test client's host only on a developer's machine (Django's test runner adds it for tests).
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS",
                               "localhost,127.0.0.1,[::1]" + (",testserver" if DEBUG else "")).split(",")
# Origins other than the site's own (scheme://host[:port]) that may post forms and open the chat's
# websocket: the public origin when a proxy passes another Host.
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o]

# --- HTTPS: set these when the site is served over TLS (docs/deploy.md)
SESSION_COOKIE_SECURE = env_bool("DJANGO_SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("DJANGO_CSRF_COOKIE_SECURE", False)
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", False)
SECURE_REDIRECT_EXEMPT = [r"^health$"]  # container health checks ask over plain HTTP
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", False)
# "HTTP_X_FORWARDED_PROTO,https": the header (as Django names it) and value by which the TLS proxy in
# front says a request came over HTTPS. Only behind a proxy that sets or strips it on every request.
_proxy_ssl_header = os.environ.get("DJANGO_SECURE_PROXY_SSL_HEADER", "")
SECURE_PROXY_SSL_HEADER = tuple(_proxy_ssl_header.split(",")) if _proxy_ssl_header else None
if SECURE_PROXY_SSL_HEADER and (len(SECURE_PROXY_SSL_HEADER) != 2 or not _proxy_ssl_header.startswith("HTTP_")):
    raise ImproperlyConfigured("DJANGO_SECURE_PROXY_SSL_HEADER must look like HTTP_X_FORWARDED_PROTO,https")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",
    "channels",
    "inference",
    "chatsite.chat",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "chatsite.csp.content_security_policy",
    "axes.middleware.AxesMiddleware",  # last: turns a locked-out login into its refusal page
]
# The REST API authenticates by key and keeps no session: it skips the browser's middleware, each of
# which costs two thread hops per request under ASGI (docs/architecture.md#what-the-settings-save).
API_PATH_PREFIXES = ("/v1/", "/v3/", "/health", "/metrics")
API_MIDDLEWARE = ["django.middleware.security.SecurityMiddleware"]

ROOT_URLCONF = "chatsite.urls"
ASGI_APPLICATION = "chatsite.asgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

VAR_DIR = Path(os.environ.get("SPECCHAT_VAR_DIR", BASE_DIR / "var"))
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}"),
        # Kept open between requests and tasks: a new connection per task is on every answer's path to its first
        # token (docs/architecture.md#what-the-settings-save). Checked before reuse, so a restart is survived.
        conn_max_age=env_int("CONN_MAX_AGE", 60),
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Write-ahead log: the web and the worker read while the other writes, and a commit is not an fsync
    # (each answer commits several times before its first token: docs/architecture.md#what-the-settings-save).
    DATABASES["default"].setdefault("OPTIONS", {})["init_command"] = (
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;")
    # A transaction takes the write lock as it begins, waiting up to `timeout` for another writer: one that read
    # first and wrote after another process's commit (a worker ending an answer) would fail at once ("database is
    # locked"), as an action of one user did while a worker wrote another's chat title.
    DATABASES["default"]["OPTIONS"].update(transaction_mode="IMMEDIATE",
                                           timeout=env_int("SPECCHAT_SQLITE_BUSY_TIMEOUT_S", 20))
if os.environ.get("DATABASE_TEST_NAME"):
    DATABASES["default"]["TEST"] = {"NAME": os.environ["DATABASE_TEST_NAME"]}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Login throttling (django-axes): after AXES_FAILURE_LIMIT wrong passwords for one username from one
# address, logins there are refused, the right password too, for the cool-off; a success resets the count.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env_int("SPECCHAT_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("SPECCHAT_LOGIN_COOLOFF_MIN", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]  # one address cannot lock everyone else out
# Reverse proxies in front of daphne that append to X-Forwarded-For (1 behind docs/deploy.md's TLS proxy): the login
# throttling then counts the client's address, not the proxy's (chatsite/proxies.py). 0: REMOTE_ADDR.
TRUSTED_PROXY_COUNT = env_int("SPECCHAT_TRUSTED_PROXY_COUNT", 0)
AXES_CLIENT_IP_CALLABLE = "chatsite.proxies.client_address"
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False  # its start-up banner would open every manage.py command's output
AUTH_PASSWORD_VALIDATORS = [{"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"}]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "chatsite" / "static"]
STATIC_ROOT = VAR_DIR / "static"
SERVE_STATIC = env_bool("SPECCHAT_SERVE_STATIC", True)  # off behind a reverse proxy that serves STATIC_ROOT

# --- Redis: Celery broker, token streams, cancel flags, worker heartbeats
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
CELERY_TASK_ACKS_LATE = True  # a generation is acknowledged once it finished
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True  # results travel through the token stream and the database
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A task not acknowledged within this is handed out again: above the longest job (an import of a large
# model). A second delivery of a running job does nothing (inference/jobs.py); lost answers are resent sooner.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env_int("SPECCHAT_TASK_VISIBILITY_TIMEOUT_S", 6 * 3600)}
# No remote control, gossip or mingle: their fan-out on the Redis transport crashed workers on a Redis restart
# (kombu 5.7); the admin's load/unload and cancels go through the product's own pub/sub (inference/transport.py).
CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
# A running answer goes on through a broker outage (its tokens reach Redis by retries; the task is acked at the end).
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False

# --- Models and generation
MODELS_ROOT = Path(os.environ.get("SPECCHAT_MODELS_ROOT", BASE_DIR / "inference" / "models")).resolve()
# Downloads kept between clones (the real pairs' checked GGUF files), never in git.
CACHE_DIR = Path(os.environ.get("SPECCHAT_CACHE_DIR", Path.home() / ".cache" / "specchat"))
DEMO_PAIR_DIR = "demo-code"
# Not a setting: a worker batches an answer's accepted tokens for this long into one Redis write, so a reader is
# woken a few times a second at most rather than at every step, well under what a reader can tell from a stream.
STREAM_FLUSH_MS = 40
STREAM_TTL_S = env_int("SPECCHAT_STREAM_TTL_S", 3600)  # a finished answer can be re-read this long
WORKER_HEARTBEAT_S = env_int("SPECCHAT_WORKER_HEARTBEAT_S", 2)
WORKER_HEARTBEAT_TTL_S = env_int("SPECCHAT_WORKER_HEARTBEAT_TTL_S", 10)
WORKER_SLOTS = env_int("SPECCHAT_WORKER_SLOTS", 16)  # concurrent generations per worker process
# A turn goes to the worker holding its conversation's cached blocks unless that worker has more than this many
# answers in flight above the least busy worker of the pair; then to the least busy (inference/serving/routing.py).
ROUTE_LOAD_MARGIN = env_int("SPECCHAT_ROUTE_LOAD_MARGIN", 2)
# A worker whose last heartbeat is older than this gets no new turn, and its queued ones go to any worker, though its
# heartbeat has not expired yet: a killed worker's turns wait this long, not WORKER_HEARTBEAT_TTL_S.
ROUTE_BEAT_LATE_S = env_int("SPECCHAT_ROUTE_BEAT_LATE_S", 3 * WORKER_HEARTBEAT_S)
# A turn its worker leaves unclaimed this long while that worker's heartbeat shows a free slot goes to any worker: a
# hung worker, or one killed where its process cannot be seen (another host or container), sooner than the above.
ROUTE_UNCLAIMED_S = env_int("SPECCHAT_ROUTE_UNCLAIMED_S", 2)
CHAT_MAX_CONCURRENT = env_int("SPECCHAT_CHAT_MAX_CONCURRENT", 2)  # answers one user may have in flight in the chat
CHAT_ABANDON_GRACE_S = env_int("SPECCHAT_CHAT_ABANDON_GRACE_S", 10)  # closed chat's answers await a reconnect
# After a chat's first answer the pair writes its title (a few greedy tokens, as Open WebUI does); 0: the
# first message's first line stays the title, and the workers do none of that work.
CHAT_WRITTEN_TITLES = env_bool("SPECCHAT_CHAT_WRITTEN_TITLES", True)
ACCESS_RECHECK_S = env_int("SPECCHAT_ACCESS_RECHECK_S", 5)  # open streams re-check their key or user this often
# A chat socket whose output waiting for the client (in daphne, past what the kernel holds) passes this is closed:
# a client that reads nothing would keep it all in daphne's memory (chatsite/edge.py). Above the largest frame a
# page is sent (a long conversation's messages).
CHAT_SOCKET_UNSENT_BYTES = env_int("SPECCHAT_CHAT_SOCKET_UNSENT_BYTES", 16 * 1024 * 1024)
# An answer's final write is retried on fresh connections this long (a database restarting, SQLite
# locked); then its readers get an error event all the same.
FINAL_WRITE_RETRY_S = env_int("SPECCHAT_FINAL_WRITE_RETRY_S", 30)
STALL_TIMEOUT_S = env_int("SPECCHAT_STALL_TIMEOUT_S", 15)  # a queued answer nobody picks up fails after this
# A queued answer whose task never reached a worker (a Redis without persistence restarted, a worker
# died after prefetching it) is sent again after this long by a worker with a free slot...
REQUEUE_AFTER_S = env_int("SPECCHAT_REQUEUE_AFTER_S", 10)
RETENTION_DAYS = env_int("SPECCHAT_RETENTION_DAYS", 90)  # `manage.py purge_history` deletes older history; 0 keeps all
QUEUE_TIMEOUT_S = env_int("SPECCHAT_QUEUE_TIMEOUT_S", 300)  # ...and failed if still queued after this
# A worker replaces a pipeline after this many requests (openvino-genai keeps memory per request served); 0: never.
ENGINE_RENEW_AFTER_REQUESTS = env_int("SPECCHAT_ENGINE_RENEW_AFTER_REQUESTS", 200)
# A pair's main alone and exact engine each hold another copy of the main: freed after this long unused; 0: kept.
RELEASE_EXTRA_ENGINES_AFTER_S = env_int("SPECCHAT_RELEASE_EXTRA_ENGINES_AFTER_S", 120)
# MB of keys and values the own engine's block pools hold, main and draft together (engines/own/block_pool.py): the
# running answers' and, in what they leave free, the prompts and answers kept for a conversation's next turn.
# 0: a quarter of the memory free when the engine loads (engines/spec.py, KV_POOL_SHARE).
KV_POOL_MB = env_int("SPECCHAT_KV_POOL_MB", 0)
# Off: no block is kept for prompts to come (the one-turn benchmarks' workers, so every line reads a new prompt whole).
PREFIX_CACHING = env_bool("SPECCHAT_PREFIX_CACHING", True)
# Whose cached blocks a request may find: "user" (its account, or its API key's owner; the system prompts the operator
# sets are shared by all), or "server" (every request's, for a team that shares everything). Under "user" neither
# cached_tokens nor the first token's wait tells one user what another sent.
PREFIX_CACHE_SCOPE = os.environ.get("SPECCHAT_PREFIX_CACHE_SCOPE", "user")
# How the own engine's main computes an answer's tokens (engines/own/model_runner.py, `arranged`): "auto" (what the
# host's probe at load finds cheaper), "queries" or "one-token" (cheaper under load and at long context, a cold prompt
# dearer: docs/exactness.md#one-kernel-path). Every arrangement is exact; one-token is served only where checked alike.
MAIN_ROWS = os.environ.get("SPECCHAT_MAIN_ROWS", "auto")
if MAIN_ROWS not in ("auto", "queries", "one-token"):
    raise ImproperlyConfigured("SPECCHAT_MAIN_ROWS must be auto, queries or one-token")
# A step process that sends no step for this long while requests wait (plus as much again per 512 prompt
# tokens still to prefill) is killed and its answers failed; the next request loads it again. 0: no watchdog.
# Well above a decode step (well under a second for the real pair here) so its answers end within a minute.
STEP_TIMEOUT_S = env_int("SPECCHAT_STEP_TIMEOUT_S", 30)
# An answer still running this long after it started is stopped and ends with an error, its text kept;
# one whose engine does not even stop is ended 10 s later all the same. 0: no limit.
MAX_ANSWER_S = env_int("SPECCHAT_MAX_ANSWER_S", 1800)
# A grammar (regex, EBNF, JSON schema) the library does not compile within this much CPU time is refused with a 400: the
# check runs in checker processes (engines/grammar/checks.py), and a grammar this slow would stall its batch's steps.
GRAMMAR_COMPILE_MS = env_int("SPECCHAT_GRAMMAR_COMPILE_MS", 1000)
# A worker plans a request's K from what its engines delivered at that load over this many seconds,
# where it measured both the main alone and a K there (serving/rates.py); 0: the profile alone.
LIVE_FIGURES_S = env_int("SPECCHAT_LIVE_FIGURES_S", 600)
LIVE_FIGURES_MIN_STEP_MS = env_int("SPECCHAT_LIVE_FIGURES_MIN_STEP_MS", 2000)  # step time a figure needs
# A worker that loads a pair on a host with no calibration of it measures the host (inference/calibration/):
# each precision configuration's main alone, the own engine per K, in two rounds. Bounded: no round starts that
# would end past CALIBRATION_S; answers CALIBRATION_TOKENS long. Off: the pair's own settings serve until the admin
# calibrates.
CALIBRATE_ON_LOAD = env_bool("SPECCHAT_CALIBRATE_ON_LOAD", True)
CALIBRATION_SECONDS = env_int("SPECCHAT_CALIBRATION_S", 240)
CALIBRATION_TOKENS = env_int("SPECCHAT_CALIBRATION_TOKENS", 48)
CALIBRATION_KS = tuple(int(k) for k in os.environ.get("SPECCHAT_CALIBRATION_KS", "1,2,3,4").split(","))
# Larger Ks, measured with the draft stopping where it is unsure (calibration/measure.py, DRAFT_STOP_BELOW).
CALIBRATION_STOPPED_KS = tuple(int(k) for k in os.environ.get("SPECCHAT_CALIBRATION_STOPPED_KS", "6,8").split(",") if k)
# The Ks answers beyond the pair's speculating streams are measured at, four at once in the own engine's batch:
# where one beats the batched main alone (with its answers), they speculate there
# (docs/speculation.md#speculating-in-the-batch; "" measures none).
CALIBRATION_BATCH_KS = tuple(int(k) for k in os.environ.get("SPECCHAT_CALIBRATION_BATCH_KS", "2,3").split(",") if k)
BENCHMARK_DIR = Path(os.environ.get("SPECCHAT_BENCHMARK_DIR", VAR_DIR / "benchmarks"))  # runs started from the admin
CONTROL_QUEUE = "control"  # Celery queue of jobs tied to no pair (imports): consumed by a worker with the train extra
IMPORT_DISK_RESERVE_GB = env_int("SPECCHAT_IMPORT_DISK_RESERVE_GB", 1)  # an import must leave this much free

# /metrics: with a token, for `Authorization: Bearer <token>` only; without, open with DEBUG on or
# SPECCHAT_METRICS_OPEN=1 (a scraper on an internal network), else refused.
METRICS_TOKEN = os.environ.get("SPECCHAT_METRICS_TOKEN", "")
METRICS_OPEN = env_bool("SPECCHAT_METRICS_OPEN", DEBUG)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}
