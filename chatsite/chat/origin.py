"""Only this site's own pages may open the chat's websocket.

Browsers send cookies with a websocket handshake from any page, so the Origin header is the only
defence against another site (or another port or scheme of this host) chatting as the visitor.
channels' AllowedHostsOriginValidator compares host names only; this compares scheme, host and port
with the request's own, as Django's CSRF check does for a form, and also accepts CSRF_TRUSTED_ORIGINS.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) origin, the port made explicit; None for anything else."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.scheme, parts.hostname, port or DEFAULT_PORTS[parts.scheme]


def _came_over_tls(scope, headers: dict[bytes, bytes]) -> bool:
    if scope.get("scheme") == "wss":
        return True
    if not settings.SECURE_PROXY_SSL_HEADER:
        return False
    name, value = settings.SECURE_PROXY_SSL_HEADER
    header = name.removeprefix("HTTP_").lower().replace("_", "-").encode()
    return headers.get(header, b"").decode("latin1").split(",")[0].strip() == value


def _trusted(origin: tuple[str, str, int]) -> bool:
    """In CSRF_TRUSTED_ORIGINS, whose hosts may start with `*.` for any subdomain (as Django reads them)."""
    for trusted in map(_origin, settings.CSRF_TRUSTED_ORIGINS):
        if trusted and trusted[0::2] == origin[0::2]:
            host = trusted[1]
            if origin[1] == host or (host.startswith("*.") and origin[1].endswith(host[1:])):
                return True
    return False


def origin_allowed(scope) -> bool:
    headers = dict(scope.get("headers", []))
    origin = _origin(headers.get(b"origin", b"").decode("latin1"))
    host = headers.get(b"host", b"").decode("latin1")
    domain, _ = split_domain_port(host)
    if origin is None or not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return False
    own = _origin(f"{'https' if _came_over_tls(scope, headers) else 'http'}://{host}")
    return origin == own or _trusted(origin)


class SameOriginValidator:
    """ASGI middleware: a websocket whose Origin is not this site's is refused before the handshake."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
