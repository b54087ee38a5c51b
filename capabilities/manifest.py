"""Capability pack manifests: validation and loading.

A pack is a directory holding ``plugin.json`` whose ``extensions["ai.yimi.capability"]``
block is validated by ``contracts/manifest.v1.schema.json``. The loader validates every
pack in the packs directory; an invalid one is refused with a readable reason and the
rest still load. Tool names the model sees are ``{pack}__{tool}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import jsonschema
from django.conf import settings

EXT = "ai.yimi.capability"
CONTRACTS = Path(__file__).resolve().parent / "contracts"
SEPARATOR = "__"
CATEGORIES = ("observe", "workspace", "owner_data", "send", "account", "delete", "physical", "spend", "self_change")


class ManifestError(Exception):
    pass


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

    def target_of(self, args: dict[str, Any]) -> str | None:
        key = self.spec.get("target")
        value = args.get(key) if key else None
        return str(value) if value is not None else None

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

    @property
    def scopes(self) -> list[str]:
        return list(self.ext["scopes"])

    @property
    def host(self) -> str:
        return self.ext["runtime"]["host"]

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
    for tool_name, spec in ext["tools"].items():
        if spec.get("check_with") and spec["check_with"] not in ext["tools"]:
            raise ManifestError(f"tools.{tool_name}.check_with names {spec['check_with']!r}, not a tool of this pack")
    tools = {name: ToolDecl(data["name"], name, spec) for name, spec in ext["tools"].items()}
    return Pack(data["name"], data["version"], data["description"], path, ext, tools)


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


def load_packs(packs_dir: Path | None = None) -> PackSet:
    """All packs in the packs directory, re-read only when a manifest changed."""
    directory = Path(packs_dir or settings.YIMI_PACKS_DIR)
    return _load(directory, _signature(directory))


@lru_cache(maxsize=8)
def _load(directory: Path, signature: tuple[tuple[str, float], ...]) -> PackSet:
    result = PackSet()
    for name, _ in signature:
        child = directory / name
        if not child.is_dir() or name.startswith((".", "_")):
            continue
        try:
            result.packs[name] = load_pack(child)
        except ManifestError as exc:
            result.refused[name] = str(exc)
    return result
