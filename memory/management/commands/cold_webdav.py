"""``manage.py cold_webdav``: the embedded default's cold storage (docs/memory.md "Cold
packs"). ``./yimi up`` without ``REDIS_URL`` and without ``YIMI_COLD_WEBDAV_URL`` runs it
and points ``YIMI_COLD_WEBDAV_URL`` / ``YIMI_COLD_WEBDAV_USER`` at it.

wsgidav (on cheroot, in this process) serves ``DATA_DIR/cold-webdav`` (0700) on 127.0.0.1
only, with basic auth: the user ``COLD_WEBDAV_USER`` and ``webdav.ensure_local_password()``
(the secrets directory's ``cold_webdav_password``, else one generated 0600 in the data
directory). The password never goes into a config file; no directory browser. Runs until
it is stopped (SIGTERM, Ctrl-C).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from memory.archive import webdav
from memory.archive.webdav_serving import wsgidav_config

HOST = "127.0.0.1"
DEFAULT_PORT = 8766
DIRECTORY = "cold-webdav"


class Command(BaseCommand):
    help = "Serve the embedded default's cold storage: wsgidav on 127.0.0.1 with basic auth, under the data directory."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the loopback port (default {DEFAULT_PORT}; ./yimi up: YIMI_COLD_WEBDAV_PORT)")

    def handle(self, *args: Any, **opts: Any) -> None:
        from cheroot import wsgi
        from wsgidav.wsgidav_app import WsgiDAVApp

        root = Path(settings.DATA_DIR) / DIRECTORY
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        root.chmod(0o700)
        password = webdav.ensure_local_password()
        logging.getLogger("wsgidav").setLevel(logging.WARNING)
        app = WsgiDAVApp(wsgidav_config(root, HOST, opts["port"], settings.COLD_WEBDAV_USER, password))
        server = wsgi.Server((HOST, opts["port"]), app, numthreads=4)
        try:
            server.prepare()  # binds: a port in use fails here, with its own message
        except OSError as exc:
            raise CommandError(f"cold storage: cannot listen on {HOST}:{opts['port']} ({exc.strerror or exc}); "
                               "set YIMI_COLD_WEBDAV_PORT to a free port") from None
        self.stdout.write(f"cold storage: wsgidav at http://{HOST}:{opts['port']}/ serving {root} "
                          f"(user {settings.COLD_WEBDAV_USER}, password from {'the secrets directory' if webdav.read_secret(settings.SECRETS_DIR, webdav.PASSWORD_SECRET) else settings.DATA_DIR / webdav.PASSWORD_SECRET})")
        self.stdout.flush()
        try:
            server.serve()
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()
