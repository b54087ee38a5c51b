from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from llm.fake_server import FakeBrainServer, Script


class Command(BaseCommand):
    help = "Serve the deterministic demo brain (an OpenAI-compatible Chat Completions endpoint)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=settings.FAKE_BRAIN_PORT)
        parser.add_argument("--no-usage", action="store_true", help="never report token usage (the records then say unknown)")
        parser.add_argument("--script", help="JSON rules file (see llm/fake_server.py), or \"demo\" for the bundled demo script")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            script = Script.load(opts["script"])
        except (OSError, ValueError, TypeError) as exc:
            raise CommandError(f"cannot read the demo brain's script {opts['script']}: {exc}") from None
        try:
            server = FakeBrainServer(opts["host"], opts["port"], script, report_usage=not opts["no_usage"])
        except OSError as exc:
            raise CommandError(
                f"the demo brain cannot listen on {opts['host']}:{opts['port']} ({exc.strerror}): "
                "another one may be running; stop it or set YIMI_FAKE_BRAIN_PORT (or --port) to a free port"
            ) from None
        self.stdout.write(f"demo brain listening on {server.base_url}", ending="\n")
        self.stdout.flush()
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
