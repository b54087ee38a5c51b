"""The websocket transport daphne runs (autobahn), with the two things Yimi's protocol
needs that daphne's command line cannot set (docs/protocol.md, "Close codes").

- A message over daphne's size limit (``--websocket-max-message-size``, 1 MiB by default)
  is refused before the application sees it. daphne leaves autobahn's ``failByDrop`` on,
  so the TCP connection would just drop (the device sees 1006, no reason); with it off,
  autobahn fails the connection with the close handshake: 1009 (Message Too Big) and a reason.
- autobahn lets an application close only with 1000 or 3000-4999, but 1013 (Try Again
  Later, IANA-registered, RFC 6455 section 7.4.2) is what a device must get when Redis or
  the database is down (``devices.consumers``). Registered codes in ``SERVER_CLOSE_CODES``
  are sent as they are.

daphne builds its websocket protocol from ``WebSocketFactory.protocol`` (the Twisted
factory's protocol class); ``install`` points it at ``DeviceSocketProtocol``. The ASGI
module calls it, so every daphne process serving ``yimi_project.asgi`` uses it.
"""

from __future__ import annotations

from daphne.ws_protocol import WebSocketFactory, WebSocketProtocol

SERVER_CLOSE_CODES = frozenset({1012, 1013, 1014})  # Service Restart, Try Again Later, Bad Gateway


class DeviceSocketProtocol(WebSocketProtocol):
    failByDrop = False  # autobahn takes a protocol class's option over the factory's

    def serverClose(self, code: int | None = None) -> None:
        if code in SERVER_CLOSE_CODES:
            self.sendCloseFrame(code=code, isReply=False)
            return
        super().serverClose(code=code)


def install() -> None:
    WebSocketFactory.protocol = DeviceSocketProtocol
