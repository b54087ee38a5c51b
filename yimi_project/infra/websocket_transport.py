"""The websocket transport daphne runs (autobahn), with the things Yimi's protocol
needs that daphne's command line cannot set (docs/protocol.md, "Close codes").

- A message the transport refuses is refused before the application sees it, and the
  device is told why. daphne leaves autobahn's ``failByDrop`` on, so the TCP connection
  would just drop (the device sees 1006, no reason); with it off, autobahn fails the
  connection with the close handshake and a reason: 1009 (Message Too Big) for a message
  over daphne's size limit (``--websocket-max-message-size``, 1 MiB by default), 1007
  (Invalid Frame Payload Data, RFC 6455 section 8.1) for a text message that is not valid
  UTF-8 — checked as the bytes arrive, fragments included, so daphne never decodes one.
- autobahn lets an application close only with 1000 or 3000-4999, but 1013 (Try Again
  Later, IANA-registered, RFC 6455 section 7.4.2) is what a device must get when Redis or
  the database is down, and 1011 (Internal Error) when the server fails before ``ready``
  (``devices.consumers.connection``). Registered codes in ``SERVER_CLOSE_CODES`` are sent as they are.

daphne builds its websocket protocol from ``WebSocketFactory.protocol`` (the Twisted
factory's protocol class); ``install`` points it at ``DeviceSocketProtocol``. The ASGI
module calls it, so every daphne process serving ``yimi_project.asgi`` uses it.

Patches: daphne's ``WebSocketFactory.protocol`` (autobahn's ``failByDrop`` and
``serverClose``), installed by ``yimi_project.asgi``. Why: the device must learn why its
socket closed (1009, 1007) and be told to come back later (1013) rather than see 1006
(docs/decisions/2026-12-03-websocket-transport.md). Drop
it when daphne lets the server turn ``failByDrop`` off and autobahn lets an application
close with 1011-1014. Tests: tests/e2e/test_e2e.py (1009, 1007, 1013), tests/devices/test_websocket.py
(1013 when Redis is down).
"""

from __future__ import annotations

from daphne.ws_protocol import WebSocketFactory, WebSocketProtocol

# Internal Error, Service Restart, Try Again Later, Bad Gateway
SERVER_CLOSE_CODES = frozenset({1011, 1012, 1013, 1014})


class DeviceSocketProtocol(WebSocketProtocol):
    # autobahn takes a protocol class's options over the factory's.
    failByDrop = False
    utf8validateIncoming = True  # autobahn's default, relied on: invalid UTF-8 closes with 1007

    def serverClose(self, code: int | None = None) -> None:
        if code in SERVER_CLOSE_CODES:
            self.sendCloseFrame(code=code, isReply=False)
            return
        super().serverClose(code=code)


def install() -> None:
    WebSocketFactory.protocol = DeviceSocketProtocol
