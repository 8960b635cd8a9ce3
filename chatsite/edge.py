"""What daphne (Twisted and Autobahn underneath) does before the application sees a request, held to what
docs/security.md promises. Installed by chatsite.asgi, which daphne imports before it listens, however it
was started (`make run`, compose, the tests, the benchmarks).

- A websocket frame over daphne's limit (1 MiB) closes the socket with 1009 and a close frame: Autobahn's
  default dropped the TCP connection, and the browser saw 1006 with no reason.
- A websocket whose unsent output passes CHAT_SOCKET_UNSENT_BYTES (a client that sends and reads nothing) is
  closed (1008): Twisted kept every frame for it, in daphne's memory.
- A request line (or header) over Twisted's 16 KiB is answered 414 (431): Twisted closed the connection without
  a word, and a long search looked like a server that died.
"""

from __future__ import annotations

import logging
from typing import Any

from daphne import server, ws_protocol
from django.conf import settings
from twisted.web import http

log = logging.getLogger(__name__)
POLICY_VIOLATION = 1008


class BoundedWebSocketProtocol(ws_protocol.WebSocketProtocol):
    def serverSend(self, content, binary=False):
        super().serverSend(content, binary)
        if self.state == self.STATE_OPEN and _unsent(self.transport) > settings.CHAT_SOCKET_UNSENT_BYTES:
            log.warning("closing a websocket of %s: it reads nothing, over %d bytes are waiting", self.client_addr,
                        settings.CHAT_SOCKET_UNSENT_BYTES)
            # Behind the unsent output, so never read: the close handshake's timeout (a second) drops the connection.
            # (sendClose takes only the codes an application may send; this one is the server's own.)
            self.sendCloseFrame(code=POLICY_VIOLATION, reasonUtf8=b"The client reads nothing.", isReply=False)


class BoundedWebSocketFactory(ws_protocol.WebSocketFactory):
    protocol = BoundedWebSocketProtocol

    def setProtocolOptions(self, **options):
        super().setProtocolOptions(**options, failByDrop=False)  # a close frame (1009 for a frame too big)


def _unsent(transport) -> int:
    """Bytes written to the connection that the kernel has not taken yet (Twisted's buffers); 0 for a transport
    that keeps none of its own (TLS terminated by daphne wraps it: the proxy in front is the usual place)."""
    return (len(getattr(transport, "dataBuffer", b"")) - getattr(transport, "offset", 0)
            + getattr(transport, "_tempDataLen", 0))


class AnsweringHTTPChannel(http.HTTPChannel):
    refused = False  # a line too long was answered: what follows of the request is dropped

    def dataReceived(self, data: bytes) -> None:
        if not self.refused:
            super().dataReceived(data)

    def lineLengthExceeded(self, line: bytes) -> None:
        """Answered, then the rest of the request is read and dropped until the client closes: closing at once
        would reset the connection before the client read the answer."""
        first_line = self._receivedHeaderSize == 0  # reset with each request
        status = b"414 URI Too Long" if first_line else b"431 Request Header Fields Too Large"
        self.refused = True
        transport: Any = self.transport  # a TCP connection (Twisted's zope interfaces do not type it as one)
        transport.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        transport.loseWriteConnection()


def install() -> None:
    server.WebSocketFactory = BoundedWebSocketFactory  # type: ignore[misc]  # what daphne's Server.run builds from
    http.HTTPChannel = AnsweringHTTPChannel  # type: ignore[misc]  # what Twisted's HTTP factories build
