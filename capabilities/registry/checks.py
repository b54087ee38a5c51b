"""Static checks on a candidate pack directory (flow F4: docs/architecture.md, "Flows").

``check_pack(directory, origin=...)`` walks the directory without following anything,
and reports every rule it breaks as a ``Finding`` with a stable ``code``:

- layout: ``absolute_path``, ``parent_reference``, ``path_not_normalized`` (a component
  that is not a portable name: ``[A-Za-z0-9_][A-Za-z0-9._-]*``), ``symlink``,
  ``special_file`` (device, FIFO, socket), ``unreadable``;
- portability: ``native_binary`` (ELF, Mach-O, PE or WebAssembly content, or a native
  extension's suffix), ``startup_hook`` (``*.pth``, ``sitecustomize.py``,
  ``usercustomize.py``: code Python runs on start-up), ``kernel_hook`` (a ``hooks/``
  directory or a manifest key that plugs into the agent kernel: ``hooks``, ``lifecycle``,
  ``middleware``, ``commands``);
- secrets: ``secret_file_name`` (``.env``, ``id_rsa``, ``*.pem``, ``credentials.json``...)
  and ``secret_value`` (a private key block, a cloud or chat token, a long literal assigned
  to a name like ``api_key``/``token``/``password``); ``secret_not_granted`` (the manifest
  declares a secret that was not granted to this pack as a published one:
  ``capabilities.registry.grants``; the owner grants it first, or the pack does without);
- manifest: ``manifest_missing``, ``manifest_invalid`` (the manifest schema, the same one
  the pack loader uses, plus the loader's own checks), ``spend_or_self_change`` (a
  yimi-maintained pack, or any pack the workshop built, declaring ``spend`` or
  ``self_change`` as an ``effect`` or in any ``effect_by_arg`` branch),
  ``maintainer_not_yimi`` (the workshop's packs are Yimi's: they cannot claim ``lead``),
  ``egress_not_public`` (the same packs naming a loopback, private, link-local or other
  non-public address or network in ``network.egress``: the egress proxy would let them
  reach it);
- ``mcp_json_missing``, ``mcp_json_invalid`` (exactly one server, stdio, command
  ``python3`` or ``node``);
- ``required_missing``: ``skills/<name>/SKILL.md`` (or ``SKILL.md``), a non-empty
  ``fake/``, ``tests/contract.yaml``, ``scripts/test.py``;
- ``adapter_missing``, ``adapter_too_long`` (the modules in ``provenance.adapters``, 200
  lines in total);
- ``too_many_files`` (32), ``file_too_large`` (128 KiB), ``pack_too_large`` (512 KiB).

A finding names the file and the rule, never the file's content: a refusal is shown to
the model and stored, and a pack may carry a secret by mistake.

The digest of a candidate is SHA-256 over its normalized file list (``path NUL size NUL
sha256`` per regular file, sorted by path), so the same content always has the same
digest wherever it was built.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from capabilities.egress import names_non_public, normalize_host
from capabilities.manifest import EXT, ManifestError, contract_validator, load_pack
from capabilities.mcp_host.secret_grants import NOT_GRANTED, PUBLISHED

MAX_FILES = 32
MAX_FILE_BYTES = 128 * 1024
MAX_TOTAL_BYTES = 512 * 1024
MAX_ADAPTER_LINES = 200
STDIO_COMMANDS = ("python3", "node")
FORBIDDEN_FOR_YIMI = ("spend", "self_change")
# Directories the walk never enters past this depth: a deeper tree is refused as a whole.
MAX_DEPTH = 8

PORTABLE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,99}$")
NATIVE_SUFFIXES = (".so", ".dylib", ".dll", ".node", ".pyd", ".ko", ".a", ".o", ".exe", ".wasm", ".pyc", ".class", ".jar")
NATIVE_MAGIC = (b"\x7fELF", b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe", b"\xca\xfe\xba\xbe", b"MZ", b"\x00asm")
STARTUP_HOOKS = ("sitecustomize.py", "usercustomize.py")
KERNEL_HOOK_KEYS = ("hooks", "lifecycle", "middleware", "commands")
SECRET_FILE_NAMES = re.compile(
    r"^(\.env(\..*)?|.*\.env|id_(rsa|dsa|ecdsa|ed25519)(\.pub)?|.*\.(pem|key|p12|pfx|jks|keystore|kdbx)|"
    r"\.?netrc|\.pgpass|credentials(\..*)?|secrets?\.(json|ya?ml|toml|ini|txt)|.*_secret(s)?\..*|service[-_]account.*\.json)$",
    re.IGNORECASE,
)
SECRET_VALUES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("private key block", re.compile(r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----")),
    ("AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("API key (sk-...)", re.compile(r"\bsk-(?:[A-Za-z0-9_-]{20,})")),
    ("GitHub token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b")),
    ("Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b")),
    ("JSON web token", re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}")),
    (
        "literal credential",
        re.compile(
            r"(?i)(?:api[_-]?key|secret|token|passw(?:or)?d|private[_-]?key|access[_-]?key|auth)[\"']?\s*[:=]\s*"
            r"[\"'][A-Za-z0-9/+_\-.=]{16,}[\"']"
        ),
    ),
)


@dataclass(frozen=True)
class Finding:
    code: str
    path: str  # relative path in the pack ("" for the pack as a whole)
    message: str  # the rule broken; never the file's content


@dataclass(frozen=True)
class PackFile:
    path: str
    size: int
    sha256: str


@dataclass
class CheckReport:
    findings: list[Finding] = field(default_factory=list)
    files: list[PackFile] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.findings

    @property
    def digest(self) -> str:
        return content_digest(self.files)

    @property
    def codes(self) -> list[str]:
        return sorted({f.code for f in self.findings})

    def add(self, code: str, path: str, message: str) -> None:
        self.findings.append(Finding(code, path, message))

    def findings_for(self, path: str, codes: tuple[str, ...]) -> list[Finding]:
        return [f for f in self.findings if f.path == path and f.code in codes]

    def as_json(self) -> list[dict[str, str]]:
        return [asdict(f) for f in self.findings]


def content_digest(files: list[PackFile]) -> str:
    """SHA-256 over the normalized file list: ``path NUL size NUL sha256 LF`` per file, by path."""
    digest = hashlib.sha256()
    for item in sorted(files, key=lambda f: f.path):
        digest.update(f"{item.path}\0{item.size}\0{item.sha256}\n".encode())
    return digest.hexdigest()


def directory_digest(directory: Path) -> str:
    """The content digest of a pack directory already on the platform (a shipped pack, the
    registry's store): every regular file, ``__pycache__`` left out, links not followed."""
    files = []
    root = Path(directory)
    for current, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not os.path.islink(os.path.join(current, d)))
        for name in sorted(names):
            full = Path(current) / name
            if full.is_symlink() or not full.is_file():
                continue
            data = full.read_bytes()
            files.append(PackFile(full.relative_to(root).as_posix(), len(data), hashlib.sha256(data).hexdigest()))
    return content_digest(files)


def check_pack(
    directory: Path, *, origin: str = "workshop", not_granted: Callable[[str, list[str]], list[str]] | None = None
) -> CheckReport:
    """Every static rule a candidate directory breaks (an empty list: it passes).

    ``origin`` is ``workshop`` (Yimi built it: the spend/self_change rule applies whatever
    the manifest says its maintainer is, and it must say ``yimi``) or ``operator``.
    ``not_granted(name, secrets)``: which of the secrets the manifest declares were not
    granted to the pack as a published one; asked only when it declares any (default: the
    registry's grants).
    """
    report = CheckReport()
    root = Path(directory)
    if not root.is_dir() or root.is_symlink():
        report.add("not_a_directory", "", "the candidate is not a directory")
        return report
    contents = _walk(root, report)
    _check_sizes(report)
    for rel, data in contents.items():
        _check_content(rel, data, report)
    manifest = _check_manifest(root, contents, origin, report)
    _check_secret_grants(manifest, report, not_granted or _registry_not_granted)
    _check_mcp_json(contents, report)
    _check_required(root, contents, manifest, report)
    _check_adapters(contents, manifest, report)
    return report


def _walk(root: Path, report: CheckReport) -> dict[str, bytes]:
    """Regular files by relative path (read with O_NOFOLLOW), recording layout findings."""
    contents: dict[str, bytes] = {}
    pending: list[tuple[Path, str, int]] = [(root, "", 0)]
    while pending:
        directory, prefix, depth = pending.pop()
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            report.add("unreadable", prefix, "a directory cannot be listed")
            continue
        for name in names:
            rel = f"{prefix}{name}"
            full = directory / name
            if not PORTABLE_NAME.match(name) or name in (".", ".."):
                report.add("path_not_normalized", rel if name.isprintable() else "(unprintable name)", "not a portable file name")
                continue
            info = os.lstat(full)
            if stat.S_ISLNK(info.st_mode):
                report.add("symlink", rel, "symbolic links are not allowed")
            elif stat.S_ISDIR(info.st_mode):
                if name == "hooks":
                    report.add("kernel_hook", rel, "a hooks/ directory would plug into the agent kernel")
                if depth + 1 >= MAX_DEPTH:
                    report.add("path_not_normalized", rel, f"nested deeper than {MAX_DEPTH} levels")
                else:
                    pending.append((full, f"{rel}/", depth + 1))
            elif stat.S_ISREG(info.st_mode):
                if info.st_size > MAX_FILE_BYTES:
                    report.add("file_too_large", rel, f"{info.st_size} bytes, more than {MAX_FILE_BYTES}")
                    report.files.append(PackFile(rel, info.st_size, ""))
                    continue
                try:
                    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
                    with os.fdopen(fd, "rb") as handle:
                        data = handle.read(MAX_FILE_BYTES + 1)
                except OSError:
                    report.add("unreadable", rel, "the file cannot be read")
                    continue
                contents[rel] = data
                report.files.append(PackFile(rel, len(data), hashlib.sha256(data).hexdigest()))
            else:
                report.add("special_file", rel, "devices, FIFOs and sockets are not allowed")
    return contents


def check_relative_path(path: str) -> str | None:
    """The rule a relative path from a manifest breaks (a code), or None."""
    if path.startswith("/") or re.match(r"^[A-Za-z]:", path):
        return "absolute_path"
    parts = path.split("/")
    if ".." in parts:
        return "parent_reference"
    if any(not PORTABLE_NAME.match(p) for p in parts):
        return "path_not_normalized"
    return None


def _check_sizes(report: CheckReport) -> None:
    if len(report.files) > MAX_FILES:
        report.add("too_many_files", "", f"{len(report.files)} files, more than {MAX_FILES}")
    total = sum(f.size for f in report.files)
    if total > MAX_TOTAL_BYTES:
        report.add("pack_too_large", "", f"{total} bytes in total, more than {MAX_TOTAL_BYTES}")


def _check_content(rel: str, data: bytes, report: CheckReport) -> None:
    name = rel.rsplit("/", 1)[-1]
    if name.lower().endswith(NATIVE_SUFFIXES) or data.startswith(NATIVE_MAGIC):
        report.add("native_binary", rel, "native or compiled code is not portable")
        return
    if name.endswith(".pth") or name in STARTUP_HOOKS:
        report.add("startup_hook", rel, "Python runs this file on start-up")
    if SECRET_FILE_NAMES.match(name):
        report.add("secret_file_name", rel, "the file name is one that holds credentials")
    text = data.decode("utf-8", errors="replace")
    for line_number, line in enumerate(text.splitlines(), start=1):
        for kind, pattern in SECRET_VALUES:
            if pattern.search(line):
                report.add("secret_value", rel, f"line {line_number} holds what looks like a {kind}")
                break


def _check_manifest(root: Path, contents: dict[str, bytes], origin: str, report: CheckReport) -> dict[str, Any]:
    raw = contents.get("plugin.json")
    if raw is None:
        report.add("manifest_missing", "plugin.json", "the pack has no plugin.json")
        return {}
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        report.add("manifest_invalid", "plugin.json", "plugin.json is not valid UTF-8 JSON")
        return {}
    if not isinstance(data, dict):
        report.add("manifest_invalid", "plugin.json", "plugin.json is not a JSON object")
        return {}
    report.manifest = data
    for key in KERNEL_HOOK_KEYS:
        if key in data:
            report.add("kernel_hook", "plugin.json", f"the manifest key {key!r} would plug into the agent kernel")
    ext = data.get("extensions", {}).get(EXT) if isinstance(data.get("extensions"), dict) else None
    ext = ext if isinstance(ext, dict) else {}
    yimi_rules = origin == "workshop" or ext.get("maintainer") == "yimi"
    if origin == "workshop" and ext.get("maintainer") != "yimi":
        report.add("maintainer_not_yimi", "plugin.json", "a pack the workshop built is maintained by yimi")
    if yimi_rules:
        for tool, branch in _forbidden_branches(ext):
            report.add("spend_or_self_change", "plugin.json", f"tools.{tool}: {branch} declares spend or self_change")
        for where in _non_public_egress(ext):
            report.add("egress_not_public", "plugin.json", f"{where} names an address that is not public (loopback, private, link-local...)")
    errors = list(contract_validator("manifest.v1.schema.json").iter_errors(data))
    schema_broken = False
    for error in sorted(errors, key=lambda e: list(e.absolute_path)):
        if error.validator == "not" and "effect" in "".join(str(p) for p in error.absolute_path):
            continue  # reported above as spend_or_self_change
        schema_broken = True
        where = ".".join(str(p) for p in error.absolute_path) or "manifest"
        # The validator's name, not its message: a message quotes the offending value.
        report.add("manifest_invalid", "plugin.json", f"{where}: breaks the schema rule {error.validator!r}")
    for label, rel in (("staging.fake", ext.get("staging", {}).get("fake")), ("tests.contract", ext.get("tests", {}).get("contract"))):
        if isinstance(rel, str):
            code = check_relative_path(rel)
            if code:
                report.add(code, "plugin.json", f"{label} is not a normalized relative path")
    if not schema_broken and not report.findings_for("plugin.json", ("absolute_path", "parent_reference", "path_not_normalized")):
        try:
            load_pack(root)
        except ManifestError as exc:
            # load_pack's reasons name files and fields of the manifest, not content.
            report.add("manifest_invalid", "plugin.json", str(exc)[:300])
    return data


def _non_public_egress(ext: dict[str, Any]) -> list[str]:
    """The egress entries that name a non-public address or network: the egress proxy lets a
    pack reach what its declaration names, so a Yimi-built pack naming 127.0.0.1 or the home
    network would reach the platform's own services or the owner's devices."""
    network = ext.get("network")
    entries = network.get("egress") if isinstance(network, dict) else None
    return [f"network.egress.{i}" for i, entry in enumerate(entries if isinstance(entries, list) else [])
            if isinstance(entry, dict) and isinstance(entry.get("host"), str) and names_non_public(normalize_host(entry["host"]))]


def _registry_not_granted(name: str, secrets: list[str]) -> list[str]:
    from capabilities.registry.grants import not_granted  # here: it imports the registry's models

    return not_granted(name, secrets, origin=PUBLISHED)


def _check_secret_grants(manifest: dict[str, Any], report: CheckReport, not_granted: Callable[[str, list[str]], list[str]]) -> None:
    """A candidate declaring a secret that was not granted to it is refused: it would start
    without it (a secret belongs to the packs it was granted to, not to any that names it)."""
    name = manifest.get("name")
    extensions = manifest.get("extensions")
    ext = extensions.get(EXT) if isinstance(extensions, dict) else None
    declared = ext.get("secrets") if isinstance(ext, dict) else None
    if not isinstance(name, str) or not isinstance(declared, list):
        return
    secrets = [s for s in declared if isinstance(s, str)]
    missing = not_granted(name[:64], secrets) if secrets else []
    if missing:
        report.add(
            NOT_GRANTED, "plugin.json",
            f"secrets: {', '.join(missing)} not granted to the pack {name[:64]}; the owner grants a secret to a pack "
            f"with manage.py pack grant {name[:64]} NAME (or in the admin), else the pack must do without",
        )


def _forbidden_branches(ext: dict[str, Any]) -> list[tuple[str, str]]:
    found = []
    raw_tools = ext.get("tools")
    tools: dict[str, Any] = raw_tools if isinstance(raw_tools, dict) else {}
    for name, spec in sorted(tools.items()):
        if not isinstance(spec, dict):
            continue
        if spec.get("effect") in FORBIDDEN_FOR_YIMI:
            found.append((str(name), "effect"))
        by_arg = spec.get("effect_by_arg")
        mapping = by_arg.get("map") if isinstance(by_arg, dict) else None
        if isinstance(mapping, dict):
            for value, category in sorted(mapping.items()):
                if category in FORBIDDEN_FOR_YIMI:
                    found.append((str(name), f"effect_by_arg branch {value!r}"))
    return found


def _check_mcp_json(contents: dict[str, bytes], report: CheckReport) -> None:
    raw = contents.get("mcp.json")
    if raw is None:
        report.add("mcp_json_missing", "mcp.json", "the pack has no mcp.json")
        return
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        report.add("mcp_json_invalid", "mcp.json", "mcp.json is not valid UTF-8 JSON")
        return
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict) or len(servers) != 1:
        report.add("mcp_json_invalid", "mcp.json", "mcp.json must declare exactly one server under mcpServers")
        return
    entry = next(iter(servers.values()))
    if not isinstance(entry, dict) or "url" in entry or entry.get("type", "stdio") != "stdio":
        report.add("mcp_json_invalid", "mcp.json", "the server must be a stdio entry")
    elif entry.get("command") not in STDIO_COMMANDS:
        report.add("mcp_json_invalid", "mcp.json", "the stdio command must be python3 or node")
    elif not isinstance(entry.get("args", []), list) or not all(isinstance(a, str) for a in entry.get("args", [])):
        report.add("mcp_json_invalid", "mcp.json", "args must be a list of strings")


def _check_required(root: Path, contents: dict[str, bytes], manifest: dict[str, Any], report: CheckReport) -> None:
    name = manifest.get("name") if isinstance(manifest.get("name"), str) else None
    skill = "SKILL.md" in contents or any(re.fullmatch(r"skills/[^/]+/SKILL\.md", p) for p in contents)
    if not skill:
        report.add("required_missing", f"skills/{name or '<name>'}/SKILL.md", "the pack has no SKILL.md")
    if not any(p.startswith("fake/") for p in contents):
        report.add("required_missing", "fake/", "the pack has no fake implementation")
    for required in ("tests/contract.yaml", "scripts/test.py"):
        if required not in contents:
            report.add("required_missing", required, "a required file is missing")


def _check_adapters(contents: dict[str, bytes], manifest: dict[str, Any], report: CheckReport) -> None:
    ext = manifest.get("extensions", {}).get(EXT, {}) if isinstance(manifest.get("extensions"), dict) else {}
    provenance = ext.get("provenance") if isinstance(ext, dict) else None
    adapters = provenance.get("adapters", []) if isinstance(provenance, dict) else []
    total = 0
    for rel in adapters if isinstance(adapters, list) else []:
        code = check_relative_path(str(rel))
        if code:
            report.add(code, "plugin.json", "provenance.adapters names a path that is not normalized")
        elif rel not in contents:
            report.add("adapter_missing", str(rel), "provenance.adapters names a file the pack does not have")
        else:
            total += contents[rel].decode("utf-8", errors="replace").count("\n") + (0 if contents[rel].endswith(b"\n") else 1)
    if total > MAX_ADAPTER_LINES:
        report.add("adapter_too_long", "", f"the adapter modules have {total} lines, more than {MAX_ADAPTER_LINES}")
