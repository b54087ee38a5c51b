"""A real WebDAV server for cold-pack tests: ``wsgidav`` (on cheroot) in a child process on a
free loopback port, serving a temporary directory with basic auth (wsgidav needs a config
file for it; the directory browser is off). ``stop()`` and ``start()`` again on the same
port and directory stand for an outage; ``requests`` counts what the server was asked
(method, path, Range header), read from its access log."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from memory.archive.webdav_serving import wsgidav_config
from tests.support.ports import free_port

USER, PASSWORD = "yimi", "webdav-test-password"
START_TIMEOUT = 30.0  # a deadline for a poll on a busy machine, never a timed assertion
BIN = Path(sys.executable).parent


def config(root: Path, port: int, user: str, password: str) -> dict[str, Any]:
    """The platform's own configuration (memory/archive/webdav_serving.py), logging every request."""
    return {**wsgidav_config(root, "127.0.0.1", port, user, password), "verbose": 3}


class WsgiDAVServer:
    def __init__(self) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="yimi-webdav-")
        base = Path(self.dir.name)
        self.root = base / "share"
        self.root.mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.config = base / "wsgidav.json"
        self.config.write_text(json.dumps(config(self.root, self.port, USER, PASSWORD)), encoding="utf-8")
        self.log = base / "wsgidav.log"
        self.process: subprocess.Popen[bytes] | None = None

    def client(self) -> httpx.Client:
        return httpx.Client(auth=(USER, PASSWORD), timeout=10.0, trust_env=False)

    def start(self) -> WsgiDAVServer:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen([str(BIN / "wsgidav"), "--config", str(self.config)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT
        with self.client() as client:
            while True:
                try:
                    if client.request("PROPFIND", self.url, headers={"Depth": "0"}).status_code == 207:
                        return self
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"wsgidav did not start: {self.log.read_text(errors='replace')[-2000:]}")
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def close(self) -> None:
        self.stop()
        self.dir.cleanup()

    def requests(self) -> list[tuple[str, str, str]]:
        """(method, path, Range header or "") of every request the server logged so far
        (its one-line request summaries, verbose 3), in order."""
        found = re.findall(r'"([A-Z]+) ([^"]+)"([^\n]*)', self.log.read_text(errors="replace"))
        ranges = [re.search(r"range=(bytes=\d+-\d*)", rest) for _m, _p, rest in found]
        return [(m, p, r.group(1) if r else "") for (m, p, _rest), r in zip(found, ranges, strict=True)]

    def files(self) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file())


@pytest.fixture
def webdav() -> Iterator[WsgiDAVServer]:
    server = WsgiDAVServer().start()
    try:
        yield server
    finally:
        server.close()
