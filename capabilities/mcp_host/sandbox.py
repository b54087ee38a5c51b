"""Pack processes run in a bubblewrap sandbox and get only what their packs declare.

A capability pack is untrusted code, whoever wrote it. Every pack host process (the
platform's ``HostManager`` and the contract runner alike) is started through
``host_parameters``, which builds a ``bwrap`` command line:

- a fresh user, PID, IPC, UTS, cgroup and network namespace (``--unshare-all``), running
  as uid/gid 65534, with ``--die-with-parent`` and ``--new-session``;
- read-only: the system directories (``/usr`` and its ``/bin``, ``/lib``... links, a few
  files of ``/etc``), the Python installation and virtual environment, the
  ``capabilities`` package (the host and ``packkit``), ``memory/assertions/speaking_rules.py`` (pure
  rules the memory pack's fake shares with the platform) and the packs directory;
- nothing else of the host: not the data directory, not the secrets directory, not the
  platform's ``/proc`` (the sandbox has its own), not the repository's other code;
- its own ``/tmp`` (also its ``HOME``) on a tmpfs, as large as its memory limit;
- writable, only when a pack declares it (``filesystem``): its own data directory
  (``own``: ``$YIMI_PACKS_DATA_DIR/<pack>``), Yimi's workspace, the mail store;
- the platform's internal socket directory, only for a pack that declares a
  ``platform_api`` (it calls back with the per-call capability of the call it executes);
- never the host's network: the sandbox's network namespace has only its own loopback. A
  pack that declares ``network.egress`` reaches exactly those destinations through its
  host's egress proxy (``egress_proxy.py``), which runs outside as the sandbox's parent and
  whose Unix socket is bound at ``/run/yimi-egress``; inside, ``HTTP(S)_PROXY`` point at
  the host's loopback shim (``egress_shim.py``). ``capabilities.egress`` is the decision.

The environment is built here too: only the variables for what was declared, and the
values of the secrets the packs declare *and were granted* (files in the secrets directory;
names starting with ``YIMI_`` are refused by the manifest schema, so no pack can ask for the
platform's own). A declared secret that was not granted to the pack (``secret_grants.py``)
is withheld: the host starts without it and is told which it lacks, so every call of that
pack answers ``secret_not_granted`` naming them.
``YIMI_PACK_SANDBOX=none`` runs hosts without bubblewrap (same environment, no
isolation) and is logged as such at every start; it exists for machines without user
namespaces and is not a supported production mode.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

from capabilities.egress import Rule, rules_from_declaration
from capabilities.manifest import Pack
from capabilities.mcp_host import egress_proxy, egress_shim
from capabilities.mcp_host.secret_grants import origin_of, read_grants, withheld_env
from yimi_project.logs import log_event
from yimi_project.secrets import read_secret

if TYPE_CHECKING:
    from mcp import StdioServerParameters

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
CAPABILITIES_DIR = REPO_ROOT / "capabilities"
# Platform code (no data, no settings) that packs may import besides capabilities/: the
# speaking-preference rules the memory pack's fake applies exactly as the platform does, and
# the simulated Mac's sandbox executor (and its simulated desktop) the owner-mac and desktop
# packs' fakes run (as device_sim mac does).
SHARED_MODULES = (
    REPO_ROOT / "memory" / "__init__.py", REPO_ROOT / "memory" / "assertions" / "__init__.py",
    REPO_ROOT / "memory" / "assertions" / "speaking_rules.py",
    REPO_ROOT / "devices" / "__init__.py", REPO_ROOT / "devices" / "mac" / "__init__.py",
    REPO_ROOT / "devices" / "mac" / "sandbox.py", REPO_ROOT / "devices" / "mac" / "desktop.py",
)
SANDBOX_UID = 65534
PLATFORM_SOCKET_IN_SANDBOX = Path("/run/yimi")
EGRESS_SOCKET_IN_SANDBOX = Path("/run/yimi-egress")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32")
ETC_FILES = (
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/passwd", "/etc/group",
    "/etc/nsswitch.conf", "/etc/hosts", "/etc/resolv.conf", "/etc/ssl/certs", "/etc/ca-certificates", "/etc/alternatives",
)
PASSED_THROUGH = ("LANG", "LC_ALL", "TZ")


class SandboxUnavailable(Exception):
    pass


@dataclass
class PackGrant:
    """What the packs of one host process were granted: environment and directories."""

    env: dict[str, str] = field(default_factory=dict)
    writable: list[Path] = field(default_factory=list)
    platform_socket_dir: Path | None = None
    withheld: dict[str, list[str]] = field(default_factory=dict)  # pack → its declared secrets not granted to it
    egress: list[Rule] = field(default_factory=list)  # where the egress proxy lets it connect; [] = no network
    egress_pack: str = ""  # whose declaration (the proxy's log lines name it)


@dataclass(frozen=True)
class PlatformPaths:
    """Where the platform keeps what packs may be granted."""

    data_dir: Path
    workspace_dir: Path
    mail_dir: Path
    secrets_dir: Path
    internal_socket: Path | None
    # The platform's packs directory (a pack directly in it is ``shipped``, any other
    # ``published``) and the secret grants' projection; None: the settings' ones.
    packs_dir: Path | None = None
    grants_file: Path | None = None

    @classmethod
    def from_settings(cls) -> PlatformPaths:
        return cls(
            data_dir=Path(settings.DATA_DIR), workspace_dir=Path(settings.YIMI_WORKSPACE_DIR), mail_dir=Path(settings.YIMI_MAIL_DIR),
            secrets_dir=Path(settings.SECRETS_DIR), internal_socket=Path(settings.YIMI_INTERNAL_SOCKET),
        )


def grant_for(packs: list[Pack], paths: PlatformPaths) -> PackGrant:
    """The environment and directories the packs of one host declared, and nothing else;
    of the secrets they declare, only those granted to them (read now: a grant or a
    revocation counts from the next host start)."""
    grant = PackGrant()
    grants = read_grants(paths.grants_file)
    shipped_dir = paths.packs_dir or Path(settings.YIMI_PACKS_DIR)
    for pack in packs:
        for fs in pack.filesystem:
            if fs == "workspace":
                grant.env["YIMI_WORKSPACE_DIR"] = str(paths.workspace_dir)
                grant.writable.append(paths.workspace_dir)
            elif fs == "mail":
                grant.env["YIMI_MAIL_DIR"] = str(paths.mail_dir)
                grant.writable.append(paths.mail_dir)
            elif fs == "own":
                root = paths.data_dir / "packs"
                grant.env["YIMI_PACKS_DATA_DIR"] = str(root)
                grant.writable.append(root / pack.name)
        if pack.platform_api and paths.internal_socket is not None:
            grant.platform_socket_dir = paths.internal_socket.parent
            grant.env["YIMI_PLATFORM_SOCKET"] = str(paths.internal_socket)
        origin = origin_of(pack.path, shipped_dir)
        for name in pack.secrets:
            if not grants.allows(origin, pack.name, name):
                grant.withheld.setdefault(pack.name, []).append(name)
                continue
            value = read_secret(paths.secrets_dir, name)
            if value:
                grant.env[name] = value
        if pack.name in grant.withheld:
            log_event("pack_secret_withheld", pack=pack.name, origin=origin, withheld=",".join(grant.withheld[pack.name]))
        if pack.egress:
            grant.egress += rules_from_declaration(pack.egress, grant.env.get)  # from the secrets it was given
            grant.egress_pack = pack.name
    if grant.withheld:
        grant.env.update(withheld_env(grant.withheld))
    return grant


def host_parameters(
    args: list[str], grant: PackGrant, *, readable: list[Path], mode: str | None = None, tmp_bytes: int | None = None
) -> StdioServerParameters:
    """The command that starts ``python -m <args>`` for a pack host, sandboxed.

    ``readable`` are the extra directories the host reads (the packs directory);
    ``tmp_bytes`` bounds its ``/tmp`` (memory: a tmpfs), as its memory limit does.
    Directories granted writable are created first, so bubblewrap can bind them.
    """
    from mcp import StdioServerParameters  # here: the MCP SDK costs ~1 s of a start (test_startup_imports)

    mode = mode or settings.YIMI_PACK_SANDBOX
    for directory in grant.writable:
        directory.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k in PASSED_THROUGH}
    env.update(grant.env)
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if mode == "none":
        log_event("pack_host_unsandboxed", reason="YIMI_PACK_SANDBOX=none", egress_unfiltered=bool(grant.egress))
        env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
        return StdioServerParameters(command=sys.executable, args=args, env=env, cwd=str(REPO_ROOT))
    if mode != "bwrap":
        raise SandboxUnavailable(f"YIMI_PACK_SANDBOX must be bwrap or none, not {mode!r}")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(
            "bubblewrap is not installed, so capability packs cannot run sandboxed: "
            "apt-get install bubblewrap (or set YIMI_PACK_SANDBOX=none to run them unsandboxed, not recommended)"
        )
    env["PATH"] = "/usr/bin:/bin"
    env["HOME"] = "/tmp"
    cmd: list[str] = ["--unshare-all", "--die-with-parent", "--new-session", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    for system in SYSTEM_DIRS:
        path = Path(system)
        if path.is_symlink():
            cmd += ["--symlink", os.readlink(path), system]
        elif path.is_dir():
            cmd += ["--ro-bind", system, system]
    for etc in ETC_FILES:
        if os.path.lexists(etc):
            cmd += ["--ro-bind-try", etc, etc]
    cmd += ["--proc", "/proc", "--dev", "/dev", *(["--size", str(tmp_bytes)] if tmp_bytes else []), "--tmpfs", "/tmp"]
    python_dirs = {Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parent.parent}
    for path in sorted(python_dirs | {CAPABILITIES_DIR, *SHARED_MODULES} | set(readable)):
        cmd += ["--ro-bind", str(path), str(path)]
    for directory in grant.writable:
        cmd += ["--bind", str(directory), str(directory)]
    if grant.platform_socket_dir is not None and "YIMI_PLATFORM_SOCKET" in env:
        grant.platform_socket_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        cmd += ["--bind", str(grant.platform_socket_dir), str(PLATFORM_SOCKET_IN_SANDBOX)]
        env["YIMI_PLATFORM_SOCKET"] = str(PLATFORM_SOCKET_IN_SANDBOX / Path(env["YIMI_PLATFORM_SOCKET"]).name)
    if grant.egress:
        return _behind_egress_proxy(bwrap, cmd, args, env, grant)
    cmd += ["--chdir", "/tmp", "--", sys.executable, *args]
    return StdioServerParameters(command=bwrap, args=cmd, env=env, cwd="/")


def _behind_egress_proxy(bwrap: str, cmd: list[str], args: list[str], env: dict[str, str], grant: PackGrant) -> StdioServerParameters:
    """``python -m capabilities.mcp_host.egress_proxy --socket S -- bwrap ...``: the proxy
    serves S (in a new private directory, bound into the sandbox) and runs the sandbox as
    its child; the rules reach it in its environment, which it removes before bwrap starts."""
    from mcp import StdioServerParameters

    socket_dir = Path(tempfile.mkdtemp(prefix="yimi-egress-"))  # 0700; short, for the 108-byte socket path limit
    inside = EGRESS_SOCKET_IN_SANDBOX / "proxy.sock"
    cmd += ["--bind", str(socket_dir), str(EGRESS_SOCKET_IN_SANDBOX), "--chdir", "/tmp", "--", sys.executable, *args]
    env[egress_shim.SOCKET_ENV] = str(inside)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        env[name] = f"http://127.0.0.1:{egress_shim.PROXY_PORT}"
    rules = {"pack": grant.egress_pack, "rules": [r.as_json() for r in grant.egress], "hosts": dict(settings.YIMI_PACK_EGRESS_HOSTS)}
    env[egress_proxy.RULES_ENV] = json.dumps(rules)
    proxy = ["-m", "capabilities.mcp_host.egress_proxy", "--socket", str(socket_dir / "proxy.sock"), "--", bwrap, *cmd]
    return StdioServerParameters(command=sys.executable, args=proxy, env=env, cwd="/")
