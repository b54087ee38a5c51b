"""The `cold-storage` service of docker/compose.yaml: a WebDAV server for cold packs.

Cold packs (docs/memory.md, "Cold packs") go to a WebDAV collection; in production that is
storage on another machine (OpenList, a NAS), and ``./yimi up`` runs ``manage.py cold_webdav``
on 127.0.0.1. On compose this service stands in for it: wsgidav (a dependency of the
platform, in the Yimi image) on cheroot, serving ``YIMI_COLD_ROOT`` (the ``cold-data``
volume, not the platform's data volume) on ``0.0.0.0:YIMI_COLD_PORT`` inside the compose
network, with basic auth for ``YIMI_COLD_WEBDAV_USER`` and the password in
``/run/secrets/cold_webdav_password``, the same secret the platform's services read. No
directory browser. Standard library, wsgidav, cheroot and the platform's Django-free
``memory/archive/webdav_serving.py`` (the configuration ``manage.py cold_webdav`` uses too): no Django.

Point ``YIMI_COLD_WEBDAV_URL`` at storage elsewhere to do without it (docker/README.md).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the platform's code (/app in the image)

from memory.archive.webdav_serving import wsgidav_config  # noqa: E402


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    env = os.environ
    root = Path(env.get("YIMI_COLD_ROOT", "/cold"))
    port = int(env.get("YIMI_COLD_PORT", "8766"))
    user = env.get("YIMI_COLD_WEBDAV_USER", "yimi")
    secret = Path(env.get("YIMI_SECRETS_DIR", "/run/secrets")) / "cold_webdav_password"
    try:
        password = secret.read_text(encoding="utf-8").strip()
    except OSError as exc:
        sys.exit(f"cold storage: cannot read {secret} ({exc.strerror}); docker/README.md, 'Prepare'")
    if not password:
        sys.exit(f"cold storage: {secret} is empty; docker/README.md, 'Prepare'")
    root.mkdir(mode=0o700, parents=True, exist_ok=True)

    from cheroot import wsgi
    from wsgidav.wsgidav_app import WsgiDAVApp

    logging.getLogger("wsgidav").setLevel(logging.WARNING)
    server = wsgi.Server(("0.0.0.0", port), WsgiDAVApp(wsgidav_config(root, "0.0.0.0", port, user, password)), numthreads=8)
    # `podman stop` sends SIGTERM: leave the serve loop as Ctrl-C does. (server.stop() called
    # from the handler waits for the loop the handler interrupted, and the container then
    # took until its stop timeout's SIGKILL.)
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"cold storage: WebDAV on port {port} serving {root} (user {user})", flush=True)
    try:
        server.start()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
