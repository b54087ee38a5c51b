from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from brain.fake_server import FakeBrainServer, Script


class Command(BaseCommand):
    help = "Serve the deterministic demo brain (an OpenAI-compatible Chat Completions endpoint)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=settings.FAKE_BRAIN_PORT)
        parser.add_argument("--script", help="JSON rules file (see brain/fake_server.py)")

    def handle(self, *args: Any, **opts: Any) -> None:
        server = FakeBrainServer(opts["host"], opts["port"], Script.load(opts["script"]))
        self.stdout.write(f"demo brain listening on {server.base_url}", ending="\n")
        self.stdout.flush()
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
