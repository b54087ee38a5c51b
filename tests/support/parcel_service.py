"""A local fake carrier tracking service, speaking real HTTP (for the parcels pack).

``GET /track/<number>`` answers ``200 {"tracking_number", "carrier", "state",
"last_event"}`` or ``404``. ``CONTRACT-1`` starts in transit and every ``DELIVERED-*``
number is delivered (as the pack's fake); a test moves a parcel with ``set_state``.
``hits`` counts the lookups per number.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

CARRIER = "Yimi Express"
EVENTS = {"in_transit": "departed sorting center", "out_for_delivery": "out for delivery", "delivered": "signed for"}


class ParcelService:
    def __init__(self) -> None:
        self.states: dict[str, str] = {"CONTRACT-1": "in_transit"}
        self.hits: Counter[str] = Counter()
        self.lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if not self.path.startswith("/track/"):
                    return self._send(404, {"error": "not_found"})
                number = unquote(self.path[len("/track/"):])
                state = service.state_of(number)
                if state is None:
                    return self._send(404, {"error": "not_found"})
                self._send(200, {"tracking_number": number, "carrier": CARRIER, "state": state, "last_event": EVENTS.get(state, state)})

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def state_of(self, number: str) -> str | None:
        with self.lock:
            self.hits[number] += 1
            if number.startswith("DELIVERED-"):
                return "delivered"
            return self.states.get(number)

    def set_state(self, number: str, state: str) -> None:
        with self.lock:
            self.states[number] = state

    def __enter__(self) -> ParcelService:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
