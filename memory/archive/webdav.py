"""A small WebDAV client for cold packs (OpenList in production, wsgidav in tests and on the
embedded default): MKCOL, PUT, GET (whole, or one byte range answered 206), DELETE and
PROPFIND, over httpx with basic auth.

Configuration (settings): ``COLD_WEBDAV_URL`` (the collection packs go under, e.g.
``https://dav.example/yimi/``; empty = cold storage not configured), ``COLD_WEBDAV_USER``;
the password is the ``cold_webdav_password`` file in the secrets directory, or — the
embedded default's local server (``manage.py cold_webdav``), like the other generated
secrets — the one generated 0600 in the data directory; read when a client is made (a
rotated password needs no restart). Every failure — the server
unreachable, a timeout, an unexpected status — is ``cold_storage_unavailable``; a missing
file is ``not_found``. Nothing here retries: the migration round tries again next time.
"""

from __future__ import annotations

import re
import secrets
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from urllib.parse import quote, unquote, urlsplit

import httpx
from django.conf import settings

from yimi_project.errors import YimiError
from yimi_project.secrets import read_secret, write_private_file

PASSWORD_SECRET = "cold_webdav_password"
TIMEOUT = httpx.Timeout(30.0, connect=5.0)
DAV = "{DAV:}"


@dataclass(frozen=True)
class Entry:
    """One member of a PROPFIND answer."""

    path: str  # relative to the client's base URL
    size: int | None
    collection: bool


def unavailable(message: str) -> YimiError:
    return YimiError("cold_storage_unavailable", message)


class WebDAV:
    """One connection pool to one WebDAV collection. Paths are relative to ``base_url``."""

    def __init__(self, base_url: str, user: str, password: str, *, transport: httpx.BaseTransport | None = None) -> None:
        if not base_url:
            raise YimiError("cold_storage_not_configured", "no cold storage is configured (COLD_WEBDAV_URL)")
        self.base_url = base_url if base_url.endswith("/") else base_url + "/"
        self.http = httpx.Client(auth=(user, password) if user else None, timeout=TIMEOUT, trust_env=False,
                                 transport=transport)

    def __enter__(self) -> WebDAV:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def url(self, path: str) -> str:
        return self.base_url + quote(path.lstrip("/"))

    def _send(self, method: str, path: str, ok: tuple[int, ...], **kwargs: object) -> httpx.Response:
        try:
            response = self.http.request(method, self.url(path), **kwargs)  # type: ignore[arg-type]
        except httpx.HTTPError as exc:
            raise unavailable(f"{method} {path}: {type(exc).__name__}") from exc
        if response.status_code == 404 and 404 not in ok:
            raise YimiError("not_found", f"{path} is not on the cold storage")
        if response.status_code not in ok:
            raise unavailable(f"{method} {path} answered {response.status_code}")
        return response

    def mkcol(self, path: str) -> bool:
        """Create a collection; False when it is already there (405)."""
        return self._send("MKCOL", path, (201, 405)).status_code == 201

    def put(self, path: str, data: bytes) -> None:
        self._send("PUT", path, (200, 201, 204), content=data, headers={"Content-Type": "application/octet-stream"})

    def get(self, path: str) -> bytes:
        return self._send("GET", path, (200,)).content

    def get_range(self, path: str, start: int, length: int) -> bytes:
        """``length`` bytes from ``start`` with one ``Range`` header: the server must answer
        206 with the matching ``Content-Range`` (a 200 with the whole file is refused, not
        sliced: a reader asked for one chunk and must not pull a whole pack)."""
        if length <= 0:
            return b""
        end = start + length - 1
        response = self._send("GET", path, (206,), headers={"Range": f"bytes={start}-{end}"})
        match = re.match(r"bytes (\d+)-(\d+)/", response.headers.get("Content-Range", ""))
        if match is None or (int(match.group(1)), int(match.group(2))) != (start, end) or len(response.content) != length:
            raise unavailable(f"GET {path} answered another range than bytes {start}-{end}")
        return response.content

    def delete(self, path: str) -> bool:
        """Delete a file or collection; False when it was not there."""
        return self._send("DELETE", path, (200, 204, 404)).status_code != 404

    def propfind(self, path: str = "", depth: int = 1) -> list[Entry]:
        """The collection (or file) at ``path`` and, with depth 1, its members."""
        body = b'<?xml version="1.0" encoding="utf-8"?><d:propfind xmlns:d="DAV:"><d:prop><d:resourcetype/><d:getcontentlength/></d:prop></d:propfind>'
        response = self._send("PROPFIND", path, (207,), content=body,
                              headers={"Depth": str(depth), "Content-Type": "application/xml"})
        try:
            root = ET.fromstring(response.content)
        except ET.ParseError as exc:
            raise unavailable(f"PROPFIND {path} answered XML that does not parse") from exc
        base = unquote(urlsplit(self.base_url).path)
        entries = []
        for item in root.iter(f"{DAV}response"):
            href = unquote(urlsplit(item.findtext(f"{DAV}href", "")).path)
            length = item.findtext(f".//{DAV}getcontentlength")
            collection = item.find(f".//{DAV}resourcetype/{DAV}collection") is not None
            relative = href[len(base):] if href.startswith(base) else href
            entries.append(Entry(relative, int(length) if length and length.isdigit() else None, collection))
        return entries


def configured() -> bool:
    return bool(settings.COLD_WEBDAV_URL)


def password() -> str:
    """The deployer's ``cold_webdav_password`` in the secrets directory, else the one
    generated in the data directory for the local server (``ensure_local_password``)."""
    return read_secret(settings.SECRETS_DIR, PASSWORD_SECRET) or read_secret(settings.DATA_DIR, PASSWORD_SECRET)


def ensure_local_password() -> str:
    """The password the embedded default's local server requires: the deployer's, if the
    secrets directory holds one; else generated once (0600, ``O_EXCL``: two processes agree)
    in the data directory, the way the Django secret key and the internal token are."""
    mounted = read_secret(settings.SECRETS_DIR, PASSWORD_SECRET)
    if mounted:
        return mounted
    write_private_file(Path(settings.DATA_DIR) / PASSWORD_SECRET, secrets.token_urlsafe(32).encode())
    return read_secret(settings.DATA_DIR, PASSWORD_SECRET)


def client() -> WebDAV:
    """A client for the configured cold storage (``cold_storage_not_configured`` without one)."""
    return WebDAV(settings.COLD_WEBDAV_URL, settings.COLD_WEBDAV_USER, password())
