"""Pack drafts: the pack template copied and filled from a build spec (flow F4).

A **build spec** (``build.json`` in a source directory, or the ``spec`` of a
``WorkshopBuild``) says what to build::

    {
      "name": "notes",                           # the pack's name (manifest rules)
      "description": "Notes in Yimi's workspace.",
      "version": "0.1.0",                        # optional
      "scopes": ["owner"],                       # optional
      "tools": {"save": {"description": "Save a note.", "effect": "workspace"}},
                                                 # the manifest's tool declarations
      "adapter": "<python: server/tools.py>",    # the tools' code (template mode)
      "fake": "<python: fake/tools.py>",         # optional; default: the server itself
      "contract": {"cases": [...]},              # tests/contract.yaml (a mapping or YAML text)
      "skill": "<markdown>",                     # optional: more text for SKILL.md
      "reuse": {"source": "mcp", "id": "weather", "wrapper": "<python>"}
                                                 # reuse mode instead of "adapter"
    }

**Template mode** copies ``workshop/template/`` (manifest skeleton, ``mcp.json`` with one
``python3`` stdio entry, the Python and TypeScript receipt helpers, ``SKILL.md``, ``fake/``,
``tests/contract.yaml``, ``scripts/test.py``) and fills it: the manifest from the spec
(maintainer ``yimi``, so the schema refuses ``spend`` and ``self_change`` in any branch),
``server/tools.py`` from the adapter, the fake, the contract and the skill.

**Reuse mode** (something ``capability_find`` found in the skill or MCP index) writes only
a manifest and a receipt wrapper: the spec carries no adapter, and its ``wrapper`` (the
``server/tools.py`` that adapts the reused thing's answers into receipts) may have at most
200 lines (``wrapper_too_long``). A reused entry with a local source directory has it
copied into ``upstream/`` unchanged. The rest of the pack is the template's.

Either way ``provenance.adapters`` names ``server/tools.py``: the registry holds the
adapter modules to 200 lines in total. Bad specs are refused with ``invalid_spec`` and a
reason, before anything is written.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from capabilities.manifest import EXT, manifest_errors
from capabilities.registry.checks import MAX_ADAPTER_LINES
from yimi_project.errors import YimiError

TEMPLATE_DIR = Path(__file__).resolve().parent / "template"
PLACEHOLDER = "PACK"  # the template's directory and mcp.json name
FIELD = re.compile(r"\{\{(name|description|tools)\}\}")  # SKILL.md's fields
SPEC_KEYS = {"name", "description", "version", "scopes", "tools", "adapter", "fake", "contract", "skill", "reuse"}
REUSE_SOURCES = ("skills", "mcp")
MAX_SOURCE_CHARS = 128 * 1024


def invalid(message: str) -> YimiError:
    return YimiError("invalid_spec", message)


def line_count(text: str) -> int:
    """Lines as the registry counts them (a last line without a newline counts)."""
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def contract_of(spec: dict[str, Any]) -> dict[str, Any]:
    contract = spec.get("contract")
    if isinstance(contract, str):
        try:
            contract = yaml.safe_load(contract)
        except yaml.YAMLError as exc:
            raise invalid(f"contract is not valid YAML ({exc})") from None
    if not isinstance(contract, dict) or not isinstance(contract.get("cases"), list) or not contract["cases"]:
        raise invalid("contract needs a non-empty list of cases (the contract format of capabilities/contract.py)")
    return {**contract, "pack": spec["name"]}


def manifest_for(spec: dict[str, Any]) -> dict[str, Any]:
    """The template's manifest skeleton filled from the spec."""
    manifest = json.loads((TEMPLATE_DIR / "plugin.json").read_text(encoding="utf-8"))
    manifest["name"] = spec["name"]
    manifest["description"] = spec["description"]
    manifest["version"] = spec.get("version", manifest["version"])
    ext = manifest["extensions"][EXT]
    ext["runtime"]["server"] = spec["name"]
    ext["tools"] = spec["tools"]
    if "scopes" in spec:
        ext["scopes"] = spec["scopes"]
    ext["provenance"]["adapters"] = ["server/tools.py"]
    reuse = spec.get("reuse")
    if reuse:
        ext["provenance"]["build"] = "reuse"
        ext["provenance"]["source"] = f"{reuse['source']}:{reuse['id']}"
    return manifest


def validate_spec(spec: Any) -> dict[str, Any]:
    """The spec, checked: its manifest passes the schema, its code is there and within
    bounds. Raises ``invalid_spec`` (or ``wrapper_too_long``) and writes nothing."""
    if not isinstance(spec, dict):
        raise invalid("a build spec is a JSON object")
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        raise invalid(f"unknown keys {unknown}; a build spec has {sorted(SPEC_KEYS)}")
    for key in ("name", "description"):
        if not isinstance(spec.get(key), str) or not spec[key]:
            raise invalid(f"{key} is required (a string)")
    if not isinstance(spec.get("tools"), dict) or not spec["tools"]:
        raise invalid("tools declares at least one tool (name → description and effect)")
    for key in ("adapter", "fake", "skill"):
        if key in spec and (not isinstance(spec[key], str) or len(spec[key]) > MAX_SOURCE_CHARS):
            raise invalid(f"{key} is text of at most {MAX_SOURCE_CHARS} characters")
    reuse = spec.get("reuse")
    if reuse is not None:
        if not isinstance(reuse, dict) or reuse.get("source") not in REUSE_SOURCES or not isinstance(reuse.get("id"), str):
            raise invalid(f"reuse names an index entry: source ({' or '.join(REUSE_SOURCES)}) and id")
        if "adapter" in spec:
            raise invalid("reuse writes only a manifest and a receipt wrapper: give reuse.wrapper, not adapter")
        wrapper = reuse.get("wrapper")
        if not isinstance(wrapper, str) or not wrapper.strip():
            raise invalid("reuse.wrapper is the receipt wrapper's code (server/tools.py)")
        if line_count(wrapper) > MAX_ADAPTER_LINES:
            raise YimiError(
                "wrapper_too_long", f"the receipt wrapper has {line_count(wrapper)} lines; a reused capability gets at most {MAX_ADAPTER_LINES}"
            )
    elif not isinstance(spec.get("adapter"), str) or not spec["adapter"].strip():
        raise invalid("adapter is the tools' code (server/tools.py), or reuse names what is reused")
    contract_of(spec)
    errors = manifest_errors(manifest_for(spec))
    if errors:
        raise invalid("the manifest would be invalid: " + "; ".join(errors))
    return spec


def fill_template(spec: dict[str, Any], dest: Path, *, upstream: Path | None = None) -> Path:
    """Copy the template to ``dest/<name>`` and fill it from the (valid) spec; ``upstream``
    is a reused entry's local source, copied into ``upstream/``. Returns the pack directory."""
    validate_spec(spec)
    name = spec["name"]
    pack = dest / name
    if pack.exists():
        raise YimiError("conflict", f"{pack.name} already exists in the build directory")
    shutil.copytree(TEMPLATE_DIR, pack, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (pack / "skills" / PLACEHOLDER).rename(pack / "skills" / name)
    (pack / "plugin.json").write_text(json.dumps(manifest_for(spec), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    mcp = (pack / "mcp.json").read_text(encoding="utf-8").replace(f'"{PLACEHOLDER}"', json.dumps(name))
    (pack / "mcp.json").write_text(mcp, encoding="utf-8")
    tools = "\n".join(
        f"- `{name}__{tool}` ({decl.get('effect') or 'effect by ' + decl['effect_by_arg']['arg']}): {decl.get('description', '')}"
        for tool, decl in spec["tools"].items()
    )
    skill = pack / "skills" / name / "SKILL.md"
    fields = {"name": name, "description": spec["description"].replace("\n", " "), "tools": tools}
    text = FIELD.sub(lambda m: fields[m.group(1)], skill.read_text(encoding="utf-8"))
    if spec.get("skill"):
        text += "\n" + spec["skill"].strip() + "\n"
    skill.write_text(text, encoding="utf-8")
    reuse = spec.get("reuse")
    (pack / "server" / "tools.py").write_text(reuse["wrapper"] if reuse else spec["adapter"], encoding="utf-8")
    if spec.get("fake"):
        (pack / "fake" / "tools.py").write_text(spec["fake"], encoding="utf-8")
    contract = yaml.safe_dump(contract_of(spec), allow_unicode=True, sort_keys=False)
    (pack / "tests" / "contract.yaml").write_text(contract, encoding="utf-8")
    if upstream is not None:
        shutil.copytree(upstream, pack / "upstream", symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return pack
