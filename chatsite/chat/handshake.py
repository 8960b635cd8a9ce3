"""A chat socket's handshake while the database is away (a PostgreSQL restart, a failover).

The handshake reads the visitor's session and user from the database before any consumer runs; an
error there would reach daphne, which answers the browser a bare HTTP 500. Here the socket is accepted,
told why in the chat's own error frame, and closed with 4503 (daphne allows only 1000 and 3000-4999
from an application: an HTTP 503 in the private range): the page shows the reason and reconnects with
its usual back-off.
"""

from __future__ import annotations

import json
import logging

from django.db import DatabaseError

from inference import errors

log = logging.getLogger(__name__)
DATABASE_UNAVAILABLE_CLOSE = 4503  # the chat page reconnects after it


class DatabaseUnavailableGuard:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        answered = False  # the handshake was accepted or refused by the app

        async def tracked_send(message):
            nonlocal answered
            answered = answered or message["type"] in {"websocket.accept", "websocket.close"}
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
            return
        except DatabaseError:
            if answered:
                raise
            log.warning("chat handshake refused: the database did not answer", exc_info=True)
        frame = {"type": "error", "code": errors.DatabaseUnavailable.code, "message": errors.DATABASE_DOWN,
                 "param": None, "ref": None}
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": json.dumps(frame)})
        await send({"type": "websocket.close", "code": DATABASE_UNAVAILABLE_CLOSE})
