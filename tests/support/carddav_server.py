"""A real CardDAV server for the personal pack: Radicale (PyPI ``radicale``) in a child
process on a free loopback port, with temporary storage and one user (htpasswd, plain),
and an empty address book created over CardDAV (extended MKCOL, RFC 5689).

``RadicaleServer().book_url`` is what the ``CARDDAV_URL`` secret holds; ``add_card`` PUTs a
vCard the way any CardDAV client would (the tests' own contacts)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.ports import free_port

USER, PASSWORD = "owner", "radicale-test-password"
MKCOL = (
    '<?xml version="1.0" encoding="utf-8"?><d:mkcol xmlns:d="DAV:" xmlns:c="urn:ietf:params:xml:ns:carddav"><d:set><d:prop>'
    "<d:resourcetype><d:collection/><c:addressbook/></d:resourcetype><d:displayname>Contacts</d:displayname></d:prop></d:set></d:mkcol>"
)
START_TIMEOUT = 30.0



class RadicaleServer:
    def __init__(self) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="yimi-radicale-")
        root = Path(self.dir.name)
        (root / "users").write_text(f"{USER}:{PASSWORD}\n", encoding="utf-8")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.book_url = f"{self.url}/{USER}/contacts/"
        self.args = [
            sys.executable, "-m", "radicale", f"--server-hosts=127.0.0.1:{self.port}",
            f"--storage-filesystem-folder={root / 'collections'}", "--auth-type=htpasswd",
            f"--auth-htpasswd-filename={root / 'users'}", "--auth-htpasswd-encryption=plain", "--logging-level=warning",
        ]
        self.process: subprocess.Popen[bytes] | None = None
        self.log = root / "radicale.log"

    def client(self) -> httpx.Client:
        return httpx.Client(auth=(USER, PASSWORD), timeout=10.0, trust_env=False)

    def __enter__(self) -> RadicaleServer:
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT
        with self.client() as client:
            while True:
                try:
                    if client.request("PROPFIND", f"{self.url}/{USER}/", headers={"Depth": "0"}).status_code == 207:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.__exit__()
                    raise RuntimeError(f"Radicale did not start: {self.log.read_text(errors='replace')}")
                time.sleep(0.1)
            made = client.request("MKCOL", self.book_url, content=MKCOL.encode(), headers={"Content-Type": "application/xml"})
            assert made.status_code == 201, made.text
        return self

    def add_card(self, uid: str, vcard: str) -> None:
        with self.client() as client:
            put = client.put(f"{self.book_url}{uid}.vcf", content=vcard.encode(), headers={"Content-Type": "text/vcard", "If-None-Match": "*"})
            assert put.status_code == 201, put.text

    def __exit__(self, *exc: Any) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.dir.cleanup()
