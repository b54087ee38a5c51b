"""Pack egress by declaration (issue 35, item 9): a pack reaches only the hosts and ports its
manifest's ``network.egress`` declares, through its host's egress proxy.

The decision (``capabilities.egress.Policy``) is tested with an injected resolver; the
sandbox end to end with a real pack under bubblewrap, served by the platform's host
manager, against servers this test starts on loopback. Names the proxy resolves come from
``YIMI_PACK_EGRESS_HOSTS`` (the proxy's own table, checked like DNS answers), never from
the system's files.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import re
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from capabilities.egress import (
    ADDRESS_REFUSED,
    NOT_DECLARED,
    UNRESOLVED,
    EgressRefused,
    Policy,
    Rule,
    rules_from_declaration,
)
from capabilities.manifest import ManifestError, load_pack
from capabilities.mcp_host.manager import HostManager
from capabilities.mcp_host.sandbox import PlatformPaths, grant_for, host_parameters
from capabilities.registry.checks import check_pack
from tests.conftest import need
from tests.support.gateway_support import manifest, write_pack
from tests.support.registry_support import candidate_manifest, write_candidate

PUBLIC = "93.184.216.34"


def resolver(table: dict[str, list[str]]) -> Any:
    def resolve(host: str, port: int, protocol: str) -> list[str]:
        if host not in table:
            raise EgressRefused(UNRESOLVED, f"{host} does not resolve")
        return table[host]

    return resolve


def refusal(policy: Policy, host: str, port: int, protocol: str = "tcp") -> str:
    with pytest.raises(EgressRefused) as caught:
        policy.check(host, port, protocol)
    return caught.value.code


# --- the decision -------------------------------------------------------------------------------


def test_a_declared_name_reaches_its_public_addresses_and_nothing_else_passes() -> None:
    policy = Policy([Rule("api.carrier.example", 443)], resolver=resolver({"api.carrier.example": [PUBLIC], "evil.example": [PUBLIC]}))
    assert [str(a) for a in policy.check("API.Carrier.Example.", 443)] == [PUBLIC]
    assert refusal(policy, "evil.example", 443) == NOT_DECLARED  # an undeclared host
    assert refusal(policy, "api.carrier.example", 80) == NOT_DECLARED  # a declared host on another port
    assert refusal(policy, "api.carrier.example", 443, "udp") == NOT_DECLARED  # another protocol
    assert refusal(policy, PUBLIC, 443) == NOT_DECLARED  # the declared name's own address, used directly


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "192.168.1.5", "169.254.169.254", "100.64.0.1", "::1", "::ffff:127.0.0.1", "fe80::1", "0.0.0.0", "224.0.0.1"])
def test_a_declared_name_that_resolves_to_a_non_public_address_is_refused(address: str) -> None:
    """DNS rebinding: the name is declared, what it resolves to is the platform's side."""
    policy = Policy([Rule("api.carrier.example", 443)], resolver=resolver({"api.carrier.example": [address]}))
    assert refusal(policy, "api.carrier.example", 443) == ADDRESS_REFUSED


def test_only_the_public_answers_of_a_mixed_resolution_are_used_and_the_table_comes_first() -> None:
    policy = Policy([Rule("api.carrier.example", 443)], hosts={"api.carrier.example": ["127.0.0.1", PUBLIC]}, resolver=resolver({}))
    assert [str(a) for a in policy.check("api.carrier.example", 443)] == [PUBLIC]
    assert refusal(Policy([Rule("nowhere.example", 443)], resolver=resolver({})), "nowhere.example", 443) == UNRESOLVED


def test_addresses_and_networks_the_declaration_names_are_reachable_even_when_private() -> None:
    rules = [Rule("192.168.1.0/24", 54321, "udp"), Rule("127.0.0.1", 5232), Rule("nas.home", 5232)]
    policy = Policy(rules, hosts={"nas.home": ["127.0.0.1"], "lamp.home": ["192.168.1.7"]})
    assert [str(a) for a in policy.check("192.168.1.7", 54321, "udp")] == ["192.168.1.7"]
    assert refusal(policy, "192.168.2.7", 54321, "udp") == NOT_DECLARED
    assert refusal(policy, "192.168.1.7", 54321, "tcp") == NOT_DECLARED
    assert [str(a) for a in policy.check("nas.home", 5232)] == ["127.0.0.1"]  # the name, and its address named too
    assert refusal(policy, "127.0.0.1", 6379) == NOT_DECLARED  # the same address, another port


def test_a_wildcard_matches_names_under_it_only() -> None:
    policy = Policy([Rule("*.carrier.example", 443)], resolver=resolver({n: [PUBLIC] for n in ("a.carrier.example", "a.b.carrier.example", "carrier.example", "evilcarrier.example")}))
    assert policy.check("a.carrier.example", 443) and policy.check("a.b.carrier.example", 443)
    assert refusal(policy, "carrier.example", 443) == NOT_DECLARED
    assert refusal(policy, "evilcarrier.example", 443) == NOT_DECLARED


# --- declarations ---------------------------------------------------------------------------------


def test_secrets_give_the_hosts_and_ports_they_hold() -> None:
    secrets = {
        "API_URL": "https://user:pw@api.carrier.example/v1/",
        "PLAIN_URL": "http://[::1]:8080/x",
        "DEVICES": json.dumps([{"host": "192.168.1.7"}, {"host": "lamp.home"}, {"host": 5}, {"name": "no host"}]),
        "BROKEN": "[not json",
    }
    declaration = [
        {"url_secret": "API_URL", "why": "w"}, {"url_secret": "PLAIN_URL", "why": "w"}, {"url_secret": "MISSING", "why": "w"},
        {"hosts_secret": "DEVICES", "field": "host", "port": 54321, "protocol": "udp", "why": "w"},
        {"hosts_secret": "BROKEN", "field": "host", "port": 1, "why": "w"},
        {"host": "*.cdn.example", "port": 443, "why": "w"},
    ]
    assert rules_from_declaration(declaration, secrets.get) == [
        Rule("api.carrier.example", 443), Rule("::1", 8080),
        Rule("192.168.1.7", 54321, "udp"), Rule("lamp.home", 54321, "udp"), Rule("*.cdn.example", 443),
    ]


@pytest.mark.parametrize(("egress", "reason"), [
    (["the carrier at API_URL"], "an egress entry is {host, port, why}"),
    ([{"host": "api.example", "port": 443}], "an egress entry is {host, port, why}"),
    ([{"host": "api.example", "port": 70000, "why": "w"}], "an egress entry is"),
    ([{"url_secret": "OTHER_URL", "why": "w"}], "'OTHER_URL' is not one of the pack's declared secrets"),
    ([{"host": "0.0.0.0/0", "port": 443, "why": "w"}], "wider than /16"),
    ([{"host": "*.com", "port": 443, "why": "w"}], "a whole top-level domain"),
    ([{"host": "API.example", "port": 443, "why": "w"}], "normal form"),
    ([{"host": "bad_name!", "port": 443, "why": "w"}], "not a host name"),
])
def test_the_loader_refuses_an_egress_declaration_it_cannot_enforce(tmp_path: Path, egress: list[Any], reason: str) -> None:
    write_pack(tmp_path, "carrier", data=manifest("carrier", secrets=["API_URL"], network={"egress": egress}))
    with pytest.raises(ManifestError, match=re.escape(reason)):
        load_pack(tmp_path / "carrier")


def test_only_a_host_with_egress_rules_starts_behind_a_proxy(tmp_path: Path, settings: Any) -> None:
    """Rules: the proxy runs bwrap with the rules in its environment. No rules (no egress
    declared, its secret missing, or the honesty check's ``no_network`` run): bwrap alone."""
    need(shutil.which("bwrap") is not None, "the pack sandbox needs bubblewrap (apt-get install bubblewrap)")
    write_pack(tmp_path, "carrier", data=manifest("carrier", network={"egress": [{"host": "api.example", "port": 443, "why": "w"}]}))
    paths = PlatformPaths(tmp_path / "d", tmp_path / "w", tmp_path / "m", tmp_path / "s", None)
    grant = grant_for([load_pack(tmp_path / "carrier")], paths)
    assert grant.egress == [Rule("api.example", 443)] and grant.egress_pack == "carrier"
    behind = host_parameters(["-m", "x"], grant, readable=[], mode="bwrap")
    socket_dir = Path(behind.args[behind.args.index("--socket") + 1]).parent
    shutil.rmtree(socket_dir)
    assert behind.args[:2] == ["-m", "capabilities.mcp_host.egress_proxy"] and "--share-net" not in behind.args
    assert json.loads((behind.env or {})["YIMI_EGRESS_RULES"])["rules"] == [{"host": "api.example", "port": 443, "protocol": "tcp"}]
    grant.egress = []
    alone = host_parameters(["-m", "x"], grant, readable=[], mode="bwrap")
    assert alone.command.endswith("bwrap") and "--share-net" not in alone.args
    assert not {"HTTPS_PROXY", "YIMI_EGRESS_SOCKET", "YIMI_EGRESS_RULES"} & set(alone.env or {})


@pytest.mark.parametrize(("host", "flagged"), [
    ("127.0.0.1", True), ("10.0.0.0/16", True), ("169.254.169.254", True), ("::1", True), ("fd00::/48", True),
    (PUBLIC, False), ("api.carrier.example", False), ("*.carrier.example", False),
])
def test_the_registry_refuses_a_yimi_built_pack_that_names_a_non_public_address(tmp_path: Path, host: str, flagged: bool) -> None:
    egress = {"egress": [{"host": host, "port": 443, "why": "w"}]}
    built = write_candidate(tmp_path / "built", manifest=candidate_manifest(network=egress))
    report = check_pack(built, origin="workshop")
    assert ("egress_not_public" in report.codes) is flagged and (report.passed is not flagged), report.as_json()
    lead = write_candidate(tmp_path / "lead", manifest=candidate_manifest(network=egress, maintainer="lead"))
    assert "egress_not_public" not in check_pack(lead, origin="operator").codes  # the operator reads what it adds


# --- in the sandbox ---------------------------------------------------------------------------------

PROBE_TOOLS = r'''
import json, os, socket, urllib.error, urllib.request
from capabilities.packkit import EgressRefused, ToolRegistry, egress_connection, receipt, udp_endpoint, value

TOOLS = ToolRegistry()


def http_get(url):
    try:
        with urllib.request.urlopen(url, timeout=20) as response:  # a bound on a failure, not a window
            return "GOT " + response.read().decode()
    except urllib.error.HTTPError as exc:
        return "refused " + (exc.headers.get("Yimi-Egress-Refused") or f"http {exc.code}")
    except OSError as exc:
        return "failed " + type(exc).__name__


def tunnel(host, port):
    try:
        with egress_connection(host, port, timeout=20) as sock:
            sock.sendall(f"GET /tunnel HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
            data = b""
            while chunk := sock.recv(4096):
                data += chunk
        return "GOT " + data.decode().rpartition("\r\n\r\n")[2]
    except EgressRefused as exc:
        return "refused " + exc.code
    except OSError as exc:
        return "failed " + type(exc).__name__


def udp(host, port):
    try:
        local = udp_endpoint(host, port)
    except EgressRefused as exc:
        return "refused " + exc.code
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(20)
        sock.sendto(b"ping", local)
        try:
            return "GOT " + sock.recvfrom(100)[0].decode()
        except OSError as exc:
            return "failed " + type(exc).__name__


def udp_many(host, port, senders):
    """A client library's way: a new socket per request (more than the host's process limit)."""
    answered = 0
    for i in range(senders):
        try:
            answered += udp(host, port) == "GOT echo ping"
        except OSError:
            pass
    return f"answered {answered} of {senders}"


def direct(host, port):
    try:
        with socket.create_connection((host, port), timeout=5):
            return "GOT connected"
    except OSError as exc:
        return "failed " + type(exc).__name__


@TOOLS("Try to reach what the arguments list.", {"type": "object"})
def probe(args):
    kinds = {"http": lambda a: http_get(a[0]), "tunnel": lambda a: tunnel(*a), "udp": lambda a: udp(*a), "udp_many": lambda a: udp_many(*a), "direct": lambda a: direct(*a)}
    results = {label: kinds[kind](rest) for label, (kind, *rest) in args["attempts"].items()}
    results["proxy in the environment"] = os.environ.get("HTTPS_PROXY", "none")
    results["proxy socket"] = "present" if os.path.exists("/run/yimi-egress") else "absent"
    return receipt("succeeded", values=[value("attempts", len(results), "count", "probe")], content={"text": json.dumps(results)})
'''


class Named(http.server.ThreadingHTTPServer):
    daemon_threads = True


def http_server(name: str) -> Named:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = f"{name} {self.path} host={self.headers.get('Host')}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = Named(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def servers() -> Iterator[dict[str, int]]:
    """Two HTTP servers (the declared one and another) and a UDP echo server, on loopback."""
    a, b = http_server("server-a"), http_server("server-b")
    echo = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    echo.bind(("127.0.0.1", 0))
    stop = threading.Event()

    def answer() -> None:
        echo.settimeout(0.2)
        while not stop.is_set():
            try:
                data, sender = echo.recvfrom(100)
            except OSError:
                continue
            echo.sendto(b"echo " + data, sender)

    threading.Thread(target=answer, daemon=True).start()
    try:
        yield {"a": a.server_address[1], "b": b.server_address[1], "udp": echo.getsockname()[1]}
    finally:
        stop.set()
        a.shutdown()
        b.shutdown()
        echo.close()


def probe_packs(packs: Path, ports: dict[str, int]) -> None:
    egress = [
        {"host": "127.0.0.1", "port": ports["a"], "why": "server A, by its address"},
        {"host": "named.test", "port": ports["a"], "why": "server A by a name that resolves to its declared address"},
        {"host": "rebind.test", "port": ports["b"], "why": "a name that resolves to loopback, whose address is not declared"},
        {"host": "127.0.0.1", "port": ports["udp"], "protocol": "udp", "why": "the UDP echo server"},
    ]
    runtime = {"server": "probe", "lazy": True, "idle_timeout_seconds": 900, "host": "dedicated"}
    tools = {"probe": {"effect": "observe"}}
    write_pack(packs, "reach", data=manifest("reach", tools=tools, scopes=["owner"], runtime=runtime, network={"egress": egress}), tools_py=PROBE_TOOLS)
    write_pack(packs, "closed", data=manifest("closed", tools=tools, scopes=["owner"], runtime=runtime), tools_py=PROBE_TOOLS)


def probe(packs: Path, tmp_path: Path, tool: str, attempts: dict[str, list[Any]]) -> dict[str, str]:
    paths = PlatformPaths(tmp_path / "data", tmp_path / "ws", tmp_path / "mail", tmp_path / "secrets", None)

    async def run() -> Any:
        manager = HostManager(packs, paths=paths, log_dir=tmp_path / "logs")
        try:
            return await manager.call(tool, {"attempts": attempts}, timeout=120)
        finally:
            await manager.close()

    result = asyncio.run(run())
    assert result.structured is not None and not result.is_error, (result, [p.read_text()[-2000:] for p in (tmp_path / "logs").glob("*.log")])
    return json.loads(result.structured["content"]["text"])


@pytest.fixture
def sandboxed(tmp_path: Path, settings: Any, servers: dict[str, int]) -> Path:
    need(shutil.which("bwrap") is not None, "the pack sandbox needs bubblewrap (apt-get install bubblewrap)")
    settings.YIMI_PACK_SANDBOX = "bwrap"
    settings.YIMI_PACK_EGRESS_HOSTS = {"named.test": ["127.0.0.1"], "rebind.test": ["127.0.0.1"], "undeclared.test": ["127.0.0.1"]}
    packs = tmp_path / "packs"
    packs.mkdir()
    probe_packs(packs, servers)
    return packs


def test_a_pack_reaches_exactly_what_it_declares(sandboxed: Path, tmp_path: Path, servers: dict[str, int]) -> None:
    a, b, echo = servers["a"], servers["b"], servers["udp"]
    results = probe(sandboxed, tmp_path, "reach__probe", {
        "declared address": ["http", f"http://127.0.0.1:{a}/x?y=1"],
        "declared name, declared address": ["http", f"http://named.test:{a}/n"],
        "declared address, tunnel": ["tunnel", "127.0.0.1", a],
        "declared udp": ["udp", "127.0.0.1", echo],
        "undeclared host": ["http", f"http://undeclared.test:{a}/"],
        "undeclared host, tunnel": ["tunnel", "undeclared.test", a],
        "direct IP not declared": ["http", f"http://127.0.0.1:{b}/"],
        "direct IP not declared, tunnel": ["tunnel", "127.0.0.1", b],
        "rebinding": ["http", f"http://rebind.test:{b}/"],
        "rebinding, tunnel": ["tunnel", "rebind.test", b],
        "undeclared udp port": ["udp", "127.0.0.1", b],
        "udp, a socket per request": ["udp_many", "127.0.0.1", echo, 300],
        "around the proxy": ["direct", "127.0.0.1", a],
    })
    print("\n".join(f"{k:34} {v}" for k, v in results.items()))
    assert results["declared address"] == f"GOT server-a /x?y=1 host=127.0.0.1:{a}"
    assert results["declared name, declared address"] == f"GOT server-a /n host=named.test:{a}"
    assert results["declared address, tunnel"] == "GOT server-a /tunnel host=127.0.0.1"
    assert results["declared udp"] == "GOT echo ping"
    assert results["undeclared host"] == results["undeclared host, tunnel"] == "refused egress_not_declared"
    assert results["direct IP not declared"] == results["direct IP not declared, tunnel"] == "refused egress_not_declared"
    assert results["rebinding"] == results["rebinding, tunnel"] == "refused egress_address_refused"
    assert results["undeclared udp port"] == "refused egress_not_declared"
    assert results["udp, a socket per request"] == "answered 300 of 300"  # no thread or association left per sender
    assert results["around the proxy"].startswith("failed")  # the sandbox has no network of its own
    assert results["proxy socket"] == "present" and results["proxy in the environment"] == "http://127.0.0.1:3128"
    log = "".join(p.read_text() for p in (tmp_path / "logs").glob("*.log"))
    assert '"event": "pack_egress_refused", "pack": "reach", "code": "egress_address_refused"' in log


def test_a_pack_that_declares_no_egress_has_no_network(sandboxed: Path, tmp_path: Path, servers: dict[str, int]) -> None:
    a = servers["a"]
    results = probe(sandboxed, tmp_path, "closed__probe", {
        "direct": ["direct", "127.0.0.1", a],
        "through a proxy port": ["direct", "127.0.0.1", 3128],
        "http": ["http", f"http://127.0.0.1:{a}/"],
        "tunnel": ["tunnel", "127.0.0.1", a],
    })
    print("\n".join(f"{k:34} {v}" for k, v in results.items()))
    assert all(results[k].startswith("failed") for k in ("direct", "through a proxy port", "http", "tunnel")), results
    assert results["proxy socket"] == "absent" and results["proxy in the environment"] == "none"
