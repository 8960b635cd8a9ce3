"""compose.yaml and the Dockerfile, checked against the settings (no Docker engine runs here)."""

from __future__ import annotations

import re
from pathlib import Path

import dj_database_url
import pytest
import yaml
from django.conf import settings
from django.core.validators import validate_slug

from inference.models import ModelPair

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]
OURS = {name: s for name, s in SERVICES.items() if "build" in s}  # built from our Dockerfile
READ_BY_OTHERS = {"HF_TOKEN"}  # read by huggingface_hub in the importer
ENV_READ = re.compile(r'(?:os\.environ\.get\(|os\.environ\[|env_bool\(|env_int\()\s*"([A-Z0-9_]+)"')


def interpolate(value: str) -> str:
    """What compose makes of ${VAR:-default} and ${VAR:?message} with nothing set: the default."""
    value = re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", str(value))
    return re.sub(r"\$\{[A-Z0-9_]+:\?[^}]*\}", "set-by-the-user", value)


def env(service: str) -> dict[str, str]:
    return {k: interpolate(v) for k, v in SERVICES[service].get("environment", {}).items()}


def seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def command(service: str) -> list[str]:
    cmd = SERVICES[service]["command"]
    return [interpolate(part) for part in (cmd.split() if isinstance(cmd, str) else cmd)]


def option(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def healthcheck(service: str) -> str:
    test = SERVICES[service]["healthcheck"]["test"]
    return " ".join(test[1:]) if isinstance(test, list) else test


def test_services_and_images():
    assert {"web", "worker", "redis", "postgres"} <= set(SERVICES)
    assert {"web", "worker"} <= set(OURS)
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", dockerfile, re.M)
    assert 'ARG EXTRAS=""' in dockerfile  # the default image has no torch; EXTRAS=train adds it
    for name, service in OURS.items():
        build = service["build"]
        args = build.get("args", {}) if isinstance(build, dict) else {}
        assert ("train" in args.get("EXTRAS", "")) == (settings.CONTROL_QUEUE in command(name)), name


def test_healthchecks():
    assert healthcheck("redis") == "redis-cli ping"
    assert healthcheck("postgres").startswith("pg_isready")
    web_cmd = command("web")[-1]
    port = re.search(r"daphne -b 0\.0\.0\.0 -p (\d+)", web_cmd).group(1)
    assert f"http://127.0.0.1:{port}/health" in healthcheck("web")
    assert "127.0.0.1" in env("web")["DJANGO_ALLOWED_HOSTS"].split(",")
    assert any(p.endswith(f":{port}") for p in SERVICES["web"]["ports"])
    for name in OURS.keys() - {"web"}:
        assert healthcheck(name) == "python -m inference.worker_health", name  # its heartbeat (test_workers.py)


def test_depends_on_healthy_services():
    for name in OURS:
        depends = SERVICES[name]["depends_on"]
        assert {"redis", "postgres"} <= set(depends), name
        assert all(d["condition"] == "service_healthy" for d in depends.values()), name
    assert "web" in SERVICES["worker"]["depends_on"]  # the web migrates the database first
    assert "migrate" in command("web")[-1]


def test_workers_start_slowly_and_stop_gracefully():
    worker = SERVICES["worker"]
    assert seconds(worker["healthcheck"]["start_period"]) >= 300
    assert seconds(worker["stop_grace_period"]) >= 60
    assert seconds(worker["stop_grace_period"]) > seconds(SERVICES["web"]["stop_grace_period"])


def test_worker_commands_serve_pair_queues_with_threads():
    for name in OURS.keys() - {"web"}:
        cmd = command(name)
        assert cmd[:4] == ["celery", "-A", "chatsite", "worker"] and option(cmd, "-P") == "threads", name
        for queue in option(cmd, "-Q").split(","):
            if queue == settings.CONTROL_QUEUE:
                continue
            slug = queue.removeprefix("pair.")
            validate_slug(slug)
            assert ModelPair(slug=slug).queue == queue
    assert option(command("worker"), "-c") == env("worker")["SPECCHAT_WORKER_SLOTS"]
    assert settings.CONTROL_QUEUE not in option(command("worker"), "-Q")  # imports need the train extra


@pytest.mark.parametrize("service", sorted(OURS))
def test_environment_matches_settings(service):
    read = set(ENV_READ.findall((ROOT / "chatsite" / "settings.py").read_text()))
    variables = env(service)
    assert set(variables) - READ_BY_OTHERS <= read, set(variables) - read
    assert variables["DJANGO_DEBUG"] == "0" and variables["DJANGO_SECRET_KEY"]

    db = dj_database_url.parse(variables["DATABASE_URL"])
    pg = env("postgres")
    assert db["ENGINE"] == "django.db.backends.postgresql" and db["HOST"] == "postgres"
    assert (db["NAME"], db["USER"], db["PASSWORD"]) == (pg["POSTGRES_DB"], pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"])
    assert re.fullmatch(r"redis://redis:\d+/\d+", variables["REDIS_URL"])


@pytest.mark.parametrize("service", sorted(OURS))
def test_models_volume_is_mounted_at_the_models_root(service):
    root = env(service)["SPECCHAT_MODELS_ROOT"]
    mounts = dict(reversed(v.split(":")[:2]) for v in SERVICES[service]["volumes"])
    assert mounts.get(root) == "models"
    assert set(mounts.values()) <= set(COMPOSE["volumes"])
    assert f"{root}/" in (ROOT / "Dockerfile").read_text()  # the image seeds the volume with the demo pair
