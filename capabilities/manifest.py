"""Capability pack manifests: validation and loading.

A pack is a directory holding ``plugin.json`` whose ``extensions["ai.yimi.capability"]``
block is validated by ``contracts/manifest.v1.schema.json``. The loader validates every
pack in the packs directory; an invalid one is refused with a readable reason and the
rest still load. Tool names the model sees are ``{pack}__{tool}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import jsonschema
from django.conf import settings

from capabilities.egress import declaration_problems

EXT = "ai.yimi.capability"
CONTRACTS = Path(__file__).resolve().parent / "contracts"
SEPARATOR = "__"
CATEGORIES = ("observe", "workspace", "owner_data", "send", "account", "delete", "physical", "spend", "self_change")


# Arguments the gateway reserves (it injects or strips them: ``capabilities.services``'s
# trusted fields, ``owner_requested``, ``payment_budget``); a ``target`` may not name them.
RESERVED_ARGUMENTS = frozenset(
    {
        "session_id", "run_id", "call_id", "idempotency_key", "payment_intent_id", "payment_authorization_id",
        "authorized_amount", "owner_requested", "payment_budget",
    }
)
# Full tool name → the required arguments of its input schema, as a pack host last listed
# them in this process (``note_listed_tools``): the default target of a tool whose manifest
# declares none.
_LISTED_REQUIRED: dict[str, tuple[str, ...]] = {}


class ManifestError(Exception):
    """Why a pack was refused. ``code`` is stable for the refusals a caller acts on
    (``pack_limit_over_ceiling``); the rest are ``manifest_invalid``."""

    def __init__(self, message: str, code: str = "manifest_invalid") -> None:
        super().__init__(message)
        self.code = code


@cache
def contract_validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((CONTRACTS / name).read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@dataclass(frozen=True)
class ToolDecl:
    pack: str
    name: str
    spec: dict[str, Any]

    @property
    def full_name(self) -> str:
        return f"{self.pack}{SEPARATOR}{self.name}"

    @property
    def retry(self) -> str:
        return self.spec.get("retry", "allowed")

    @property
    def check_with(self) -> str | None:
        return self.spec.get("check_with")

    @property
    def context_inject(self) -> list[str]:
        return list(self.spec.get("context_inject", []))

    @property
    def task_type(self) -> str:
        return self.spec.get("task_type", self.name)

    @property
    def long_running(self) -> bool:
        return bool(self.spec.get("long_running", False))

    @property
    def declared_target(self) -> list[str] | None:
        """The argument names the manifest's ``target`` gives (one name or a list), or None."""
        declared = self.spec.get("target")
        if declared is None:
            return None
        return [declared] if isinstance(declared, str) else list(declared)

    def target_names(self) -> list[str]:
        """The arguments that identify what a call of this tool acts on: the manifest's
        ``target``; else the required arguments of the tool's input schema as a pack host
        listed it in this process; else none, and the tool as a whole is the target."""
        declared = self.declared_target
        if declared is not None:
            return declared
        return list(_LISTED_REQUIRED.get(self.full_name, ()))

    def target_key(self, args: dict[str, Any]) -> str:
        """The target of a call as one comparable string: the values of ``target_names()``
        (absent ones as null). Two calls with the same key act on the same thing."""
        return json.dumps(
            {name: args.get(name) for name in self.target_names()},
            sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str,
        )

    def target_arguments(self, args: dict[str, Any]) -> dict[str, str]:
        """The declared target arguments of a call and their values, as the per-call
        capability carries them (a pack's operation must be on them)."""
        return {name: str(args[name]) for name in self.declared_target or [] if args.get(name) is not None}

    def target_of(self, args: dict[str, Any]) -> str | None:
        """The declared target as text, for consent (a card's target, a remembered
        recipient): the value of a single target argument, or the present values of several."""
        names = self.declared_target or []
        present = {name: args[name] for name in names if args.get(name) is not None}
        if not present:
            return None
        if len(names) == 1:
            return str(present[names[0]])
        return json.dumps(present, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)

    def resolve_category(self, args: dict[str, Any]) -> str | None:
        """The effect category of this call, or None when it cannot be resolved
        (there is no guessed default)."""
        if "effect" in self.spec:
            return self.spec["effect"]
        by_arg = self.spec["effect_by_arg"]
        value = args.get(by_arg["arg"])
        if not isinstance(value, str):
            return None
        return by_arg["map"].get(value)


@dataclass(frozen=True)
class Pack:
    name: str
    version: str
    description: str
    path: Path
    ext: dict[str, Any]
    tools: dict[str, ToolDecl]
    # The content digest of a version published through the registry; "" for a shipped pack.
    digest: str = ""

    @property
    def scopes(self) -> list[str]:
        return list(self.ext["scopes"])

    @property
    def secrets(self) -> list[str]:
        return list(self.ext["secrets"])

    @property
    def egress(self) -> list[dict[str, Any]]:
        """Where the pack may connect (``capabilities.egress``): each entry a host and port,
        a declared secret's URL, or the hosts a declared secret lists; [] is no network."""
        return [dict(entry) for entry in self.ext["network"]["egress"]]

    @property
    def enabled_by_default(self) -> bool:
        """Packs that act on the owner's devices or home (``owner-mac``, ``phone``, ``mijia``)
        ship off: the operator turns them on with ``YIMI_PACKS_ENABLE``."""
        return bool(self.ext.get("enabled_by_default", True))

    @property
    def platform_api(self) -> list[str]:
        """The platform's pack endpoints it may call (with a per-call capability)."""
        return list(self.ext.get("platform_api", []))

    @property
    def filesystem(self) -> list[str]:
        """Directories it may write: ``own`` (its private data directory), ``workspace``, ``mail``."""
        return list(self.ext.get("filesystem", []))

    @property
    def limits(self) -> dict[str, int]:
        """What its host may use instead of the platform's defaults (``processes``,
        ``memory_mib``, ``cpu_seconds``, ``open_files``; ``mcp_host/limits.py``)."""
        return dict(self.ext.get("limits", {}))

    @property
    def host(self) -> str:
        """``shared`` only for a pack that asked for it and needs nothing of its own: one
        process serving several packs gives each of them everything any of them holds, so a
        pack with secrets, directories, network or platform access, or limits of its own,
        always runs alone."""
        needs = self.secrets or self.egress or self.platform_api or self.filesystem or self.limits
        return "shared" if self.ext["runtime"]["host"] == "shared" and not needs else "dedicated"

    @property
    def lazy(self) -> bool:
        return bool(self.ext["runtime"]["lazy"])

    @property
    def idle_timeout_seconds(self) -> int:
        return int(self.ext["runtime"].get("idle_timeout_seconds", 900))

    @property
    def maintainer(self) -> str:
        return self.ext["maintainer"]


@dataclass
class PackSet:
    packs: dict[str, Pack] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # directory name → reason
    disabled: dict[str, str] = field(default_factory=dict)  # pack name → why it is off

    def tool(self, full_name: str) -> ToolDecl | None:
        pack_name, sep, tool_name = full_name.partition(SEPARATOR)
        pack = self.packs.get(pack_name) if sep else None
        return pack.tools.get(tool_name) if pack else None

    def tools_for_scope(self, scope: str) -> list[ToolDecl]:
        return [t for p in self.packs.values() if scope in p.scopes for t in p.tools.values()]


def _readable(error: jsonschema.ValidationError) -> str:
    where = ".".join(str(p) for p in error.absolute_path) or "manifest"
    if error.validator == "not" and "effect" in "".join(str(p) for p in error.absolute_path):
        return f"{where}: a yimi-maintained pack may not declare spend or self_change"
    if error.validator == "oneOf" and list(error.absolute_path)[-1:] == ["target"]:
        return f"{where}: target is an argument name or a list of argument names"
    if error.validator == "oneOf" and "egress" in error.absolute_path:
        return f"{where}: an egress entry is {{host, port, why}}, {{url_secret, why}} or {{hosts_secret, field, port, why}}"
    if error.validator == "oneOf" and "tools" in error.absolute_path:
        return f"{where}: a tool declares exactly one of effect or effect_by_arg"
    return f"{where}: {error.message}"


def manifest_errors(data: Any) -> list[str]:
    """Every schema violation in a parsed plugin.json, as readable sentences."""
    validator = contract_validator("manifest.v1.schema.json")
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    return [_readable(e) for e in errors]


def load_pack(path: Path) -> Pack:
    """Read and validate one pack directory; raise ManifestError with the reason."""
    manifest_file = path / "plugin.json"
    try:
        data = json.loads(manifest_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError("plugin.json is missing") from None
    except ValueError as exc:
        raise ManifestError(f"plugin.json is not valid JSON ({exc})") from None
    errors = manifest_errors(data)
    if errors:
        raise ManifestError("; ".join(errors))
    ext = data["extensions"][EXT]
    if data["name"] != path.name:
        raise ManifestError(f"the pack is named {data['name']!r} but lives in {path.name!r}")
    for label, rel in (("staging.fake", ext["staging"]["fake"]), ("tests.contract", ext["tests"]["contract"])):
        if not (path / rel).exists():
            raise ManifestError(f"{label} points to {rel}, which does not exist")
    if not list(path.glob("skills/*/SKILL.md")):
        raise ManifestError("the pack has no skills/*/SKILL.md")
    if ext.get("limits") and settings.configured:
        # The ceilings are the platform's settings; a process without them (a pack host, a
        # self-test in the workshop sandbox) is never the one that decides what a host gets.
        from capabilities.mcp_host.limits import OVER_CEILING, ceilings, over_ceiling

        too_high = over_ceiling(ext["limits"], ceilings())
        if too_high:
            raise ManifestError(f"{OVER_CEILING}: " + "; ".join(too_high), code=OVER_CEILING)
    egress_problems = declaration_problems(ext["network"]["egress"], ext["secrets"])
    if egress_problems:
        raise ManifestError("; ".join(egress_problems))
    for tool_name, spec in ext["tools"].items():
        if spec.get("check_with") and spec["check_with"] not in ext["tools"]:
            raise ManifestError(f"tools.{tool_name}.check_with names {spec['check_with']!r}, not a tool of this pack")
        target = spec.get("target")
        reserved = sorted(RESERVED_ARGUMENTS.intersection([target] if isinstance(target, str) else target or []))
        if reserved:
            raise ManifestError(f"tools.{tool_name}.target names {', '.join(reserved)}, which the gateway sets itself")
    tools = {name: ToolDecl(data["name"], name, spec) for name, spec in ext["tools"].items()}
    return Pack(data["name"], data["version"], data["description"], path, ext, tools)


def note_listed_tools(listed: Mapping[str, Any]) -> None:
    """Remember the required arguments of tools as a pack host listed them (MCP
    ``tools/list``; full tool name → tool): the default target of a tool whose manifest
    declares no ``target``."""
    for name, tool in listed.items():
        if isinstance(tool, Mapping):
            schema = tool.get("input_schema", tool.get("inputSchema"))
        else:
            schema = getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None)
        required = schema.get("required") if isinstance(schema, Mapping) else None
        names = [r for r in required if isinstance(r, str) and r not in RESERVED_ARGUMENTS] if isinstance(required, list) else []
        _LISTED_REQUIRED[name] = tuple(names)


def _signature(packs_dir: Path) -> tuple[tuple[str, float], ...]:
    if not packs_dir.is_dir():
        return ()
    sig = []
    for child in sorted(packs_dir.iterdir()):
        manifest = child / "plugin.json"
        try:
            sig.append((child.name, manifest.stat().st_mtime_ns))
        except (FileNotFoundError, NotADirectoryError):
            sig.append((child.name, -1))
    return tuple(sig)


@dataclass(frozen=True)
class Selection:
    """What the pack registry selected (``capabilities.registry.publish`` writes it from the
    database after every change): the published versions online, name → (directory,
    digest), and the enable switches staff and operators set, name → on/off."""

    published: tuple[tuple[str, str, str], ...] = ()
    switches: tuple[tuple[str, bool], ...] = ()


def selection_file() -> Path:
    return Path(settings.YIMI_PACK_REGISTRY_DIR) / "selection.json"


def read_selection() -> Selection:
    """The registry's selection file, re-parsed only when it changed. A file (not the
    database) because the loader runs on the pack hosts' event loop and in every process
    (web, worker, beat), and each must see a publish without a restart."""
    path = selection_file()
    try:
        info = path.stat()
    except OSError:
        return Selection()
    return _parse_selection(path, info.st_mtime_ns, info.st_size)


@lru_cache(maxsize=4)
def _parse_selection(path: Path, mtime_ns: int, size: int) -> Selection:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        published = tuple(sorted((str(n), str(v["path"]), str(v["digest"])) for n, v in data.get("published", {}).items()))
        switches = tuple(sorted((str(n), bool(v)) for n, v in data.get("switches", {}).items()))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return Selection()
    return Selection(published, switches)


def load_packs(packs_dir: Path | None = None) -> PackSet:
    """The enabled packs: the shipped ones in the packs directory and the versions the pack
    registry published, re-read only when a manifest, the switches or the registry's
    selection changed. Whether a pack is on, first rule that applies:

    1. ``YIMI_PACKS_DISABLE`` names it → off (the deployer's switch wins over everything);
    2. the registry's switch for it (staff admin, ``manage.py pack enable|disable``) → that;
    3. ``YIMI_PACKS_ENABLE`` names it → on;
    4. its manifest's ``enabled_by_default`` (true unless it says false).

    A pack that is off is listed in ``disabled`` and offers no tools (``pack_contract``
    still runs it). A published pack whose name a shipped pack has is refused."""
    directory = Path(packs_dir or settings.YIMI_PACKS_DIR)
    switches = (tuple(sorted(settings.YIMI_PACKS_ENABLE)), tuple(sorted(settings.YIMI_PACKS_DISABLE)))
    return _load(directory, _signature(directory), switches, read_selection())


@lru_cache(maxsize=8)
def _load(
    directory: Path, signature: tuple[tuple[str, float], ...], switches: tuple[tuple[str, ...], tuple[str, ...]],
    selection: Selection = Selection(),
) -> PackSet:
    enable, disable = switches
    registry_switch = dict(selection.switches)
    result = PackSet()
    found: list[Pack] = []
    for name, _ in signature:
        child = directory / name
        if not child.is_dir() or name.startswith((".", "_")):
            continue
        try:
            found.append(load_pack(child))
        except ManifestError as exc:
            result.refused[name] = str(exc)
    shipped = {name for name, _ in signature}
    for name, path, digest in selection.published:
        if name in shipped:
            result.refused[name] = "a shipped pack has this name; the published version is not loaded"
            continue
        try:
            found.append(replace(load_pack(Path(path)), digest=digest))
        except ManifestError as exc:
            result.refused[name] = f"published version {digest[:12]}: {exc}"
    for pack in found:
        if pack.name in disable:
            result.disabled[pack.name] = "turned off by YIMI_PACKS_DISABLE"
        elif registry_switch.get(pack.name) is False:
            result.disabled[pack.name] = "turned off in the pack registry"
        elif registry_switch.get(pack.name) is None and not pack.enabled_by_default and pack.name not in enable:
            result.disabled[pack.name] = f"off by default; YIMI_PACKS_ENABLE={pack.name} turns it on"
        else:
            result.packs[pack.name] = pack
    return result
