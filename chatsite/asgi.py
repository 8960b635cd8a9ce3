"""daphne's application: the site (chat, admin) and the REST API over HTTP, the chat's websocket."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
# No persistent database connections here. Django keeps a connection in the thread that opened it, and
# under ASGI each request runs in a thread of its own that ends with it: every request left a
# connection behind, and PostgreSQL (max_connections 100) refused new ones within 30 s of 16 streams.
# Workers, whose threads live on, keep theirs.
os.environ["CONN_MAX_AGE"] = "0"
site_app = get_asgi_application()

from django.conf import settings
from django.core.handlers.asgi import ASGIHandler

from chatsite import edge

edge.install()  # daphne's bounds, before it listens (it imports this module first)


class ApiHandler(ASGIHandler):
    """Django with settings.API_MIDDLEWARE instead of settings.MIDDLEWARE, for the REST API."""

    def load_middleware(self, is_async=False):
        site_middleware = settings.MIDDLEWARE
        settings.MIDDLEWARE = settings.API_MIDDLEWARE  # read only here, once, as the handler is built
        try:
            super().load_middleware(is_async)
        finally:
            settings.MIDDLEWARE = site_middleware


api_app = ApiHandler()
if settings.SERVE_STATIC:
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    site_app = ASGIStaticFilesHandler(site_app)  # daphne alone serves the few static files


async def http_app(scope, receive, send):
    app = api_app if scope["path"].startswith(settings.API_PATH_PREFIXES) else site_app
    return await app(scope, receive, send)


from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter

from chatsite.chat.handshake import DatabaseUnavailableGuard
from chatsite.chat.origin import SameOriginValidator
from chatsite.chat.routing import websocket_urlpatterns

application = ProtocolTypeRouter(
    {
        "http": http_app,
        "websocket": SameOriginValidator(
            DatabaseUnavailableGuard(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))),
    }
)
