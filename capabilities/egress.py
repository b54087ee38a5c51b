"""Pack egress by declaration: the destinations a manifest names, and the check.

A pack reaches the network only through its host's egress proxy
(``mcp_host/egress_proxy.py``), and the proxy lets a connection through only to what the
pack's manifest declares in ``network.egress``. Each entry names where and why:

- ``{"host": H, "port": P, "protocol": "tcp"|"udp", "why": ...}``: H is a DNS name, a
  wildcard ``*.example.com`` (any name under it, not the name itself), an IP address or a
  network in CIDR form (at least /16 for IPv4, /48 for IPv6); ``protocol`` defaults to tcp;
- ``{"url_secret": NAME, "why": ...}``: the host and port of the ``http``/``https`` URL
  the declared secret NAME holds (the operator's configuration; TCP);
- ``{"hosts_secret": NAME, "field": F, "port": P, "protocol": ..., "why": ...}``: each
  host of the JSON list of objects the declared secret NAME holds (the value of F in each).

When a host starts, ``rules_for`` turns the declarations of its pack (a pack that declares
egress always has a host of its own) into ``Rule``s; a secret that is missing or does not
parse gives no rule. ``Policy.check`` is the proxy's decision for one connection:

1. host, port and protocol match a rule, else ``egress_not_declared``. A name matches a
   name or wildcard rule; an IP address (a "direct IP") matches only an address or network
   a rule names.
2. The proxy resolves a name itself (``hosts`` first, an injected table, then DNS), else
   ``egress_unresolved``.
3. It connects only to addresses that are public (``ipaddress``'s ``is_global``, not
   multicast) or that a rule for that port and protocol names explicitly (an address, a
   network, or a secret's URL or host that is an IP literal). A declared name that resolves
   only to loopback, private, link-local or other non-public addresses is refused
   (``egress_address_refused``): DNS rebinding cannot turn a declared name into the
   platform's own services.

This module is the standard library only: the proxy process imports it without Django.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
PROTOCOLS = ("tcp", "udp")
DEFAULT_PORTS = {"http": 80, "https": 443}
# The narrowest a declared network may be: wider ones are a whole provider or the internet.
MIN_PREFIX = {4: 16, 6: 48}
LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")

# Stable codes of a refusal (the proxy's answer and its log line).
NOT_DECLARED = "egress_not_declared"
ADDRESS_REFUSED = "egress_address_refused"
UNRESOLVED = "egress_unresolved"
UNREACHABLE = "egress_unreachable"
BAD_REQUEST = "egress_bad_request"


class EgressRefused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


def normalize_host(host: str) -> str:
    """Lower case, no trailing dot, no IPv6 brackets."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host[:-1] if host.endswith(".") else host


def as_address(host: str) -> IPAddress | None:
    """The address ``host`` is, or None for a name. An IPv4-mapped IPv6 address is its IPv4 one."""
    try:
        address = ipaddress.ip_address(normalize_host(host))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def as_network(host: str) -> IPNetwork | None:
    if "/" not in host:
        return None
    try:
        return ipaddress.ip_network(normalize_host(host), strict=True)
    except ValueError:
        return None


def is_dns_name(host: str) -> bool:
    labels = host.split(".")
    return 0 < len(host) <= 253 and all(LABEL.match(label) for label in labels) and not labels[-1].isdigit()


def is_public(address: IPAddress) -> bool:
    return address.is_global and not address.is_multicast


def names_non_public(host: str) -> bool:
    """Whether a declared host is an address or network that is not all public."""
    address = as_address(host)
    if address is not None:
        return not is_public(address)
    network = as_network(host)
    return network is not None and not (network.is_global and not network.is_multicast)


def host_problem(host: str) -> str | None:
    """Why ``host`` cannot be declared (None: it can): a name, ``*.name``, an address or a network."""
    if host != normalize_host(host):
        return f"{host!r} is not written in its normal form (lower case, no trailing dot, no brackets)"
    if as_address(host) is not None:
        return None
    if "/" in host:
        network = as_network(host)
        if network is None:
            return f"{host!r} is not a network in CIDR form (address/prefix, no host bits set)"
        if network.prefixlen < MIN_PREFIX[network.version]:
            return f"{host!r} is wider than /{MIN_PREFIX[network.version]}"
        return None
    name = host[2:] if host.startswith("*.") else host
    if not is_dns_name(name):
        return f"{host!r} is not a host name, *.name, IP address or network"
    if host.startswith("*.") and "." not in name:
        return f"{host!r} would match a whole top-level domain"
    return None


@dataclass(frozen=True)
class Rule:
    """One destination a pack may reach: a host (name, ``*.name``, address or network), a port, a protocol."""

    host: str
    port: int
    protocol: str = "tcp"

    def as_json(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "protocol": self.protocol}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Rule:
        return cls(normalize_host(str(data["host"])), int(data["port"]), str(data.get("protocol", "tcp")))

    @property
    def names_addresses(self) -> IPNetwork | None:
        """The addresses this rule names explicitly (an address is a one-address network)."""
        address = as_address(self.host)
        if address is not None:
            return ipaddress.ip_network(address)
        return as_network(self.host)

    def matches(self, host: str, port: int, protocol: str) -> bool:
        if port != self.port or protocol != self.protocol:
            return False
        address = as_address(host)
        network = self.names_addresses
        if address is not None or network is not None:
            return address is not None and network is not None and address in network
        if self.host.startswith("*."):
            return host.endswith(self.host[1:])
        return host == self.host


# --- declarations → rules ------------------------------------------------------------------


def declaration_problems(declaration: Any, secrets: Iterable[str]) -> list[str]:
    """What is wrong in one pack's ``network.egress`` beyond the schema (the loader's check)."""
    problems = []
    declared = set(secrets)
    for i, entry in enumerate(declaration):
        where = f"network.egress.{i}"
        if "host" in entry:
            problem = host_problem(entry["host"])
            if problem:
                problems.append(f"{where}.host: {problem}")
        for key in ("url_secret", "hosts_secret"):
            if key in entry and entry[key] not in declared:
                problems.append(f"{where}.{key}: {entry[key]!r} is not one of the pack's declared secrets")
    return problems


def rules_from_declaration(declaration: Iterable[Mapping[str, Any]], secret: Callable[[str], str | None]) -> list[Rule]:
    """The rules one pack's egress declaration gives, with ``secret(name)`` the value of a
    declared secret (None when missing). A secret that does not parse gives no rule."""
    rules: list[Rule] = []
    for entry in declaration:
        protocol = str(entry.get("protocol", "tcp"))
        if "host" in entry:
            rules.append(Rule(normalize_host(entry["host"]), int(entry["port"]), protocol))
        elif "url_secret" in entry:
            rule = _rule_from_url(secret(entry["url_secret"]) or "")
            if rule is not None:
                rules.append(rule)
        elif "hosts_secret" in entry:
            rules += [Rule(host, int(entry["port"]), protocol) for host in _hosts_from_json(secret(entry["hosts_secret"]) or "", entry["field"])]
    return list(dict.fromkeys(rules))


def _rule_from_url(value: str) -> Rule | None:
    try:
        parts = urlsplit(value.strip())
        port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return None
    host = normalize_host(parts.hostname or "")
    if parts.scheme not in DEFAULT_PORTS or port is None or not host or host_problem(host) or "/" in host or host.startswith("*."):
        return None
    return Rule(host, port, "tcp")


def _hosts_from_json(value: str, field: str) -> list[str]:
    try:
        rows = json.loads(value) if value.strip() else []
    except ValueError:
        return []
    hosts = []
    for row in rows if isinstance(rows, list) else []:
        host = row.get(field) if isinstance(row, dict) else None
        if isinstance(host, str) and not host_problem(normalize_host(host)) and "/" not in host and not host.startswith("*."):
            hosts.append(normalize_host(host))
    return hosts


# --- the decision ------------------------------------------------------------------------------

Resolver = Callable[[str, int, str], list[str]]


def system_resolver(host: str, port: int, protocol: str) -> list[str]:
    """The addresses DNS (the proxy's own, outside the sandbox) gives ``host``."""
    kind = socket.SOCK_DGRAM if protocol == "udp" else socket.SOCK_STREAM
    try:
        infos = socket.getaddrinfo(host, port, type=kind)
    except (socket.gaierror, UnicodeError) as exc:
        raise EgressRefused(UNRESOLVED, f"{host} does not resolve ({exc})") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class Policy:
    """The proxy's decision for one host's packs: ``check`` → the addresses it may connect to."""

    def __init__(self, rules: Iterable[Rule], *, hosts: Mapping[str, list[str]] | None = None, resolver: Resolver = system_resolver) -> None:
        self.rules = list(rules)
        self.hosts = {normalize_host(name): list(addresses) for name, addresses in (hosts or {}).items()}
        self.resolver = resolver

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Policy:
        return cls([Rule.from_json(r) for r in config.get("rules", [])], hosts=config.get("hosts") or {})

    def check(self, host: str, port: int, protocol: str = "tcp") -> list[IPAddress]:
        """The addresses a connection to ``host:port`` over ``protocol`` may use, in order;
        raises ``EgressRefused`` (not declared, unresolved, or no address it may use)."""
        host = normalize_host(host)
        if protocol not in PROTOCOLS or not 0 < port < 65536 or not host:
            raise EgressRefused(BAD_REQUEST, f"{protocol} {host}:{port} is not a destination")
        rules = [rule for rule in self.rules if rule.matches(host, port, protocol)]
        if not rules:
            raise EgressRefused(NOT_DECLARED, f"{host}:{port}/{protocol} is not declared in the pack's network.egress")
        direct = as_address(host)
        if direct is not None:
            return [direct]  # matched an address or network a rule names
        found = self.hosts[host] if host in self.hosts else self.resolver(host, port, protocol)
        addresses = [a for a in (as_address(text) for text in found) if a is not None]
        if not addresses:
            raise EgressRefused(UNRESOLVED, f"{host} does not resolve")
        named = [net for rule in self.rules if rule.port == port and rule.protocol == protocol for net in [rule.names_addresses] if net]
        allowed = [a for a in addresses if is_public(a) or any(a.version == net.version and a in net for net in named)]
        if not allowed:
            listed = ", ".join(str(a) for a in addresses)
            raise EgressRefused(ADDRESS_REFUSED, f"{host} resolves to {listed}: not public, and the declaration names none of them")
        return allowed
