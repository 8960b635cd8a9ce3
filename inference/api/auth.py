"""API keys and the per-key limit on generations in flight.

Only a key's SHA-256 is stored, so a leaked database leaks no usable key. The limit counts the
key's queued and running Generation rows (the truth, whatever process or connection started
them), under a Redis lock so two requests arriving together cannot both take the last slot.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from inference import errors
from inference.models import ApiKey, Generation

KEY_PREFIX = "sk-spec-"
LAST_USED_RESOLUTION = timedelta(minutes=1)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def set_new_key(api_key: ApiKey) -> str:
    """Give `api_key` a fresh secret (prefix and hash only) and return the secret, to show once."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    api_key.prefix = key[: ApiKey._meta.get_field("prefix").max_length]
    api_key.key_hash = hash_key(key)
    return key


def usable_keys():
    """Keys that may be used: not revoked, and owned by nobody or by an active user."""
    return ApiKey.objects.filter(revoked=False).filter(Q(user__isnull=True) | Q(user__is_active=True))


def key_is_usable(*, api_key_id) -> bool:
    """Asked again every few seconds by open streams, which end once their key was revoked."""
    return usable_keys().filter(id=api_key_id).exists()


def authenticate(*, authorization: str) -> ApiKey:
    """The live key named by an `Authorization: Bearer <key>` header, or a 401 error."""
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise errors.InvalidKey(
            "No API key: send it as `Authorization: Bearer <key>`.")
    api_key = usable_keys().filter(key_hash=hash_key(key.strip())).first()
    if api_key is None:
        raise errors.InvalidKey(
            "Incorrect or revoked API key.")
    now = timezone.now()
    if api_key.last_used_at is None or now - api_key.last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.filter(id=api_key.id).update(last_used_at=now)  # not a write per request
    return api_key


def check_metrics_access(*, authorization: str) -> None:
    """/metrics names the pairs and their load: with METRICS_TOKEN set, only a scraper sending it as a
    bearer token reads them; without, only with METRICS_OPEN (DEBUG, or an internal network)."""
    if settings.METRICS_TOKEN:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(),
                                                                      settings.METRICS_TOKEN.encode()):
            raise errors.InvalidKey("The metrics need `Authorization: Bearer <SPECCHAT_METRICS_TOKEN>`.")
    elif not settings.METRICS_OPEN:
        raise errors.Forbidden("The metrics are not served here: set SPECCHAT_METRICS_TOKEN (or "
                               "SPECCHAT_METRICS_OPEN=1 on an internal network).")


def owned_generation(*, api_key: ApiKey, generation_id) -> Generation:
    """A generation started with this key, or a 404 error."""
    generation = Generation.objects.filter(api_key=api_key, id=generation_id).select_related("pair").first()
    if generation is None:
        raise errors.NotFound("No such generation for this key.", param="generation_id")
    return generation
