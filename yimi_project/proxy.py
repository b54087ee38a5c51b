"""Behind a reverse proxy: whose ``X-Forwarded-*`` headers are believed, and the public URL.

Only a peer listed in ``YIMI_TRUSTED_PROXIES`` (addresses or CIDR networks, none by default)
may say who the client is (``X-Forwarded-For``) and that the client used HTTPS
(``X-Forwarded-Proto``). ``TrustedProxyMiddleware`` runs first in ``MIDDLEWARE``:

1. the direct peer (``REMOTE_ADDR``, from daphne's scope) is not a trusted proxy: both
   headers are dropped from ``request.META``, so nothing downstream (``is_secure()`` through
   ``SECURE_PROXY_SSL_HEADER``, the pairing rate limit, django-axes) can read them;
2. it is: ``REMOTE_ADDR`` becomes the right-most ``X-Forwarded-For`` address that is not a
   trusted proxy (entries to its left were written by the client and are not believed). When
   every hop is trusted, the left-most one is the client; an entry that is not an address
   ends the walk, and the trusted hop to its right is the client.

The websocket consumers never read the client address, so websocket scopes are left as
daphne made them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from functools import lru_cache
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from yimi_project.middleware import BeforeViewMiddleware

if TYPE_CHECKING:  # settings.py imports this module: keep its imports light
    from django.http import HttpRequest

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

FORWARDED_FOR = "HTTP_X_FORWARDED_FOR"
FORWARDED_PROTO = "HTTP_X_FORWARDED_PROTO"


@lru_cache(maxsize=8)
def _networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError as exc:
            raise ImproperlyConfigured(f"YIMI_TRUSTED_PROXIES: {entry!r} is not an address or CIDR network") from exc
    return tuple(networks)


def trusted_networks(entries: Iterable[str]) -> tuple[Network, ...]:
    """Parse ``YIMI_TRUSTED_PROXIES``; a malformed entry is a configuration error."""
    return _networks(tuple(e for e in entries if e.strip()))


def parse_address(value: str | None) -> Address | None:
    """An IP address as daphne or a proxy writes it (``[::1]`` allowed), else None."""
    if not value:
        return None
    value = value.strip()
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def is_trusted(address: Address | None, networks: tuple[Network, ...]) -> bool:
    return address is not None and any(address in network for network in networks)


def forwarded_client(peer: str | None, forwarded_for: str | None, networks: tuple[Network, ...]) -> str | None:
    """The client address for a request from ``peer`` carrying ``forwarded_for``, or None
    when ``peer`` is not a trusted proxy (then the header says nothing)."""
    hop = parse_address(peer)
    if not is_trusted(hop, networks):
        return None
    assert hop is not None
    for entry in reversed((forwarded_for or "").split(",")):
        address = parse_address(entry)
        if address is None:
            break
        hop = address
        if not is_trusted(address, networks):
            break
    return str(hop)


def apply_forwarded_headers(meta: dict[str, Any], networks: tuple[Network, ...]) -> None:
    """Rewrite ``REMOTE_ADDR`` for a trusted proxy's request; drop the forwarded headers otherwise."""
    client = forwarded_client(meta.get("REMOTE_ADDR"), meta.get(FORWARDED_FOR), networks)
    if client is None:
        meta.pop(FORWARDED_FOR, None)
        meta.pop(FORWARDED_PROTO, None)
    else:
        meta["REMOTE_ADDR"] = client


class TrustedProxyMiddleware(BeforeViewMiddleware):
    """Only ``request.META`` is touched, before anything else reads it."""

    def before(self, request: HttpRequest) -> None:
        apply_forwarded_headers(request.META, trusted_networks(settings.YIMI_TRUSTED_PROXIES))
        return None


def public_origin(url: str) -> tuple[str, str]:
    """``(host, origin)`` of ``YIMI_PUBLIC_URL`` (e.g. ``https://yimi.example.org``), checked:
    http or https, a host, no path, query or credentials."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ImproperlyConfigured(f"YIMI_PUBLIC_URL must look like https://yimi.example.org, not {url!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        raise ImproperlyConfigured("YIMI_PUBLIC_URL is a scheme, a host and an optional port; Yimi is served at /")
    try:
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError as exc:
        raise ImproperlyConfigured(f"YIMI_PUBLIC_URL has a malformed port: {url!r}") from exc
    host = parts.hostname
    if ":" in host:
        host = f"[{host}]"
    default_port = {"http": 80, "https": 443}[parts.scheme]
    netloc = host if parts.port in (None, default_port) else f"{host}:{parts.port}"
    return host, f"{parts.scheme}://{netloc}"
