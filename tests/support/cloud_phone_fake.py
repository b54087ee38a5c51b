"""A local cloud phone speaking real HTTP (for the phone pack), and a scripted model.

``CloudPhoneService`` serves the phone API of ``packs/phone/fake/world.py`` (devices,
leases, screen tree, tap, input, launch, home, login data) over a real socket, on the
scripted world (an app list, 奶茶小铺 with a checkout, Notes). ``/model/chat/completions``
is a scripted OpenAI-compatible executor model (``world.scripted_answer``, non-streaming),
so ``PHONE_MODEL_URL = url + "/model"``.

For the tests: ``hold_taps()`` makes every tap wait until ``let_taps_go()`` (a tap in
flight while a task is cancelled), ``tap_started`` is set when a held tap arrived, and
``world.events`` lists leases, taps, inputs and releases in the order they happened.
``model_calls`` counts the model's steps.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_PATH = Path(__file__).resolve().parents[2] / "packs" / "phone" / "fake" / "world.py"
_spec = importlib.util.spec_from_file_location("cloud_phone_world", _PATH)
assert _spec is not None and _spec.loader is not None
world = importlib.util.module_from_spec(_spec)
sys.modules["cloud_phone_world"] = world
_spec.loader.exec_module(world)


class CloudPhoneService:
    def __init__(self) -> None:
        self.world = world.World()
        self.model_calls = 0
        self.tap_gate = threading.Event()
        self.tap_gate.set()
        self.tap_started = threading.Event()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def _body(self) -> dict[str, Any] | None:
                length = int(self.headers.get("Content-Length") or 0)
                if not length:
                    return None
                data = json.loads(self.rfile.read(length))
                return data if isinstance(data, dict) else None

            def _serve(self, method: str) -> None:
                body = self._body()
                if self.path == "/model/chat/completions" and method == "POST":
                    service.model_calls += 1
                    text = world.scripted_answer((body or {}).get("messages") or [])
                    return self._send(200, {"object": "chat.completion", "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]})
                if method == "POST" and self.path.endswith("/tap") and not service.tap_gate.is_set():
                    service.tap_started.set()
                    service.tap_gate.wait(30)
                status, answer = world.route(service.world, method, self.path, body)
                self._send(status, answer)

            def do_GET(self) -> None:  # noqa: N802 - http.server's names
                self._serve("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._serve("POST")

            def do_DELETE(self) -> None:  # noqa: N802
                self._serve("DELETE")

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body, ensure_ascii=False).encode()
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

    def hold_taps(self) -> None:
        self.tap_started.clear()
        self.tap_gate.clear()

    def let_taps_go(self) -> None:
        self.tap_gate.set()

    def __enter__(self) -> CloudPhoneService:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.tap_gate.set()
        self.server.shutdown()
        self.server.server_close()
