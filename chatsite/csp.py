"""Content-Security-Policy on the site's pages (Django 5.2 has none built in).

Model output is attacker-influenced. Whatever a sanitiser might let through, the browser still
runs no inline script, applies no inline style, loads nothing from elsewhere and posts forms
nowhere else. The chat's pages need nothing inline: their script and style are static files and
their data sits in a JSON script element, which is not executed.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction
from django.core.exceptions import DisallowedHost
from django.utils.decorators import sync_and_async_middleware

SITE_POLICY = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self' data:",
    "connect-src": "'self'",  # and the site's own websocket origin, added per request
    "object-src": "'none'",
    "frame-ancestors": "'none'",
    "form-action": "'self'",
    "base-uri": "'none'",
}
# The admin's scripts are files too, but Django's templates carry a few inline styles; the admin shows
# no model output as HTML (it escapes every field), so inline style there is not the attacker's.
ADMIN_POLICY = {**SITE_POLICY, "style-src": "'self' 'unsafe-inline'"}


def policy(request) -> str:
    directives = dict(ADMIN_POLICY if _is_admin(request) else SITE_POLICY)
    try:
        host = request.get_host()
    except DisallowedHost:  # the 400 page of a request for another host: 'self' alone
        host = ""
    if host:
        directives["connect-src"] += f" {'wss' if request.is_secure() else 'ws'}://{host}"
    return "; ".join(f"{name} {value}" for name, value in directives.items())


def _is_admin(request) -> bool:
    match = getattr(request, "resolver_match", None)
    return match is not None and match.app_name == "admin"


@sync_and_async_middleware
def content_security_policy(get_response):
    async def async_middleware(request):
        response = await get_response(request)
        response.headers.setdefault("Content-Security-Policy", policy(request))
        return response

    def sync_middleware(request):
        response = get_response(request)
        response.headers.setdefault("Content-Security-Policy", policy(request))
        return response

    return async_middleware if iscoroutinefunction(get_response) else sync_middleware
