"""More than one web (daphne) process on one public port: ``./yimi up`` with
``YIMI_WEB_PROCESSES=N``.

How the processes share the port: Twisted's TCP endpoints (26.x, the version installed) have
no ``reusePort`` option, but daphne adopts a listening socket it inherits (``--fd``, its
``fd:`` endpoint: ``AdoptedStreamServerEndpoint``, IPv4). So each web process is started
through ``serve`` here: it binds its own socket to the same address with ``SO_REUSEPORT``
(Linux: the kernel spreads new connections over the sockets bound to the port) and
``exec``s daphne on it. One address, one port, N processes; a device's websocket stays on
the process that accepted it.

What the processes share is everything else: the database (PostgreSQL) and the channel
layer (Redis), through which a frame for a device reaches whichever process holds its
socket. The embedded default has neither (SQLite and the in-memory channel layer, which
lives inside one process), so ``check`` refuses more than one process there.

The internal listener (``YIMI_INTERNAL_SOCKET``: the gateway for the worker, pack
callbacks) is served by the first process only: every internal endpoint works from the
database and signed capabilities, so one listener serves the platform's processes and
packs whichever web process or worker started them.

    python -m yimi_project.web_processes check N
    python -m yimi_project.web_processes serve HOST PORT [--internal-socket PATH]
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

DAPHNE_APP = "yimi_project.asgi:application"


def refusal(processes: int, databases: Mapping[str, Any], channel_layers: Mapping[str, Any]) -> str | None:
    """Why ``processes`` web processes cannot run on these settings, in one line; None when they can."""
    if processes < 1:
        return f"YIMI_WEB_PROCESSES must be 1 or more, not {processes}"
    if processes == 1:
        return None
    engine = str(databases["default"]["ENGINE"])
    backend = str(channel_layers["default"]["BACKEND"])
    missing = []
    if "postgresql" not in engine:
        missing.append("DATABASE_URL (PostgreSQL)")
    if "redis" not in backend.lower():
        missing.append("REDIS_URL")
    if not missing:
        return None
    return (
        f"YIMI_WEB_PROCESSES={processes} refused: web processes share state only through PostgreSQL and Redis, "
        f"and SQLite with the in-memory channel layer lives in one process; set {' and '.join(missing)}, "
        "or run one web process"
    )


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening IPv4 TCP socket on ``host:port`` with ``SO_REUSEPORT``, inheritable."""
    try:
        family_ok = isinstance(ipaddress.ip_address(host), ipaddress.IPv4Address)
    except ValueError:
        family_ok = False
    if not family_ok:
        # daphne's fd: endpoint adopts AF_INET sockets only.
        raise ValueError(f"more than one web process needs an IPv4 address for YIMI_HOST, not {host!r}")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def daphne_argv(daphne: str, fd: int, internal_socket: str | None) -> list[str]:
    argv = [daphne, "--fd", str(fd)]
    if internal_socket:
        argv += ["-u", internal_socket]
    return [*argv, DAPHNE_APP]


def _check(processes: int) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "yimi_project.settings")
    from django.conf import settings

    reason = refusal(processes, settings.DATABASES, settings.CHANNEL_LAYERS)
    if reason:
        print(reason, file=sys.stderr)
        return 2
    return 0


def _serve(host: str, port: int, internal_socket: str | None) -> None:
    sock = reuse_port_socket(host, port)
    if internal_socket:
        Path(internal_socket).unlink(missing_ok=True)
    daphne = str(Path(sys.executable).with_name("daphne"))
    os.execv(daphne, daphne_argv(daphne, sock.fileno(), internal_socket))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m yimi_project.web_processes")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="refuse N web processes on the embedded default")
    check.add_argument("processes", type=int)
    serve = commands.add_parser("serve", help="one web process on a SO_REUSEPORT socket")
    serve.add_argument("host")
    serve.add_argument("port", type=int)
    serve.add_argument("--internal-socket", default=None)
    args = parser.parse_args(argv)
    if args.command == "check":
        return _check(args.processes)
    try:
        _serve(args.host, args.port, args.internal_socket)
    except (ValueError, OSError) as exc:
        print(f"web process: {exc}", file=sys.stderr)
        return 2
    return 0  # not reached: exec


if __name__ == "__main__":
    sys.exit(main())
