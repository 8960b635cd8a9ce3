"""The client's address as the login throttling counts it (django-axes' AXES_CLIENT_IP_CALLABLE).

Behind the TLS proxy docs/deploy.md recommends, REMOTE_ADDR is the proxy's: every login would come from one address,
and five wrong passwords for a username would lock it for everyone. Each trusted proxy appends the address it was
reached from to X-Forwarded-For, so with SPECCHAT_TRUSTED_PROXY_COUNT = n the client is the n-th entry from the
right; whatever a client wrote into the header itself stands to the left of it and is never read. (django-ipware
does this among many rules; a count of trusted proxies is the one this deployment needs.)
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def client_address(request: HttpRequest) -> str:
    remote = request.META.get("REMOTE_ADDR", "")
    proxies = settings.TRUSTED_PROXY_COUNT
    if not proxies:
        return remote
    forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
    return forwarded[-proxies] if len(forwarded) >= proxies else remote
