"""The pack's self-test: its contract cases (tests/contract.yaml) against its fake, in process.

    python3 scripts/test.py            # the fake (what the workshop runs, in its sandbox)
    python3 scripts/test.py --real     # the real server

The contract format is the platform's (capabilities/contract.py): cases of steps, each a
tool call with ``args``, ``save`` and ``expect``; ``${run}`` and saved variables are
substituted; ``only: real|fake`` cases run for that implementation only. Every result must
be a receipt that passes the platform's receipt checks unchanged (schema, then no
violation or contradiction once normalized). Prints one line per case and a JSON summary
last; exits 0 only when every case passed. Needs nothing but the platform's capabilities
package and PyYAML, so it runs in the workshop sandbox (no network, read-only).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml

from capabilities.manifest import load_pack
from capabilities.packkit import run_with_capability
from capabilities.receipts import normalize, schema_errors

PACK_DIR = Path(__file__).resolve().parent.parent
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def substitute(value: Any, variables: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        return {k: substitute(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, variables) for v in value]
    if isinstance(value, str):
        whole = VARIABLE.fullmatch(value)
        if whole:
            return variables[whole.group(1)]
        return VARIABLE.sub(lambda m: str(variables[m.group(1)]), value)
    return value


def matches(expected: Any, actual: Any) -> bool:
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(k in actual and matches(v, actual[k]) for k, v in expected.items())
    if isinstance(expected, list):
        return isinstance(actual, list) and len(expected) == len(actual) and all(map(matches, expected, actual))
    if isinstance(expected, bool) or isinstance(actual, bool):
        return isinstance(expected, bool) and isinstance(actual, bool) and expected == actual
    return expected == actual


def dig(data: Any, path: str) -> Any:
    for part in path.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def check(expect: dict[str, Any], r: dict[str, Any]) -> list[str]:
    """The failed expectations (the contract format's ``expect`` keys)."""
    nxt, content, error = r.get("next", {}), r.get("content", {}), r.get("error") or {}
    items = content.get("items", [])
    actual = {
        "status": r["status"], "content_text": content.get("text"), "error_code": error.get("code"),
        "retry": nxt.get("retry"), "check_with": nxt.get("check_with"), "waiting_on": nxt.get("waiting_on"),
        "unknowns_count": len(r.get("unknowns", [])), "content_items_count": len(items),
    }
    failures = [f"{k}: expected {expect[k]!r}, got {v!r}" for k, v in actual.items() if k in expect and not matches(expect[k], v)]
    for key, found in (("effects", r.get("effects", [])), ("values", r.get("values", [])), ("content_items", items)):
        wanted = expect.get(key)
        if wanted == [] and key != "content_items" and found:
            failures.append(f"{key}: expected none, got {found!r}")
        failures += [f"{key}: nothing matches {w!r}" for w in wanted or [] if not any(matches(w, f) for f in found)]
    failures += [f"content_items: {a!r} should be absent" for a in expect.get("content_items_absent", []) if any(matches(a, i) for i in items)]
    for key, text in (("content_text_contains", content.get("text", "")), ("summary_contains", r.get("summary", ""))):
        if key in expect and str(expect[key]) not in str(text):
            failures.append(f"{key}: {expect[key]!r} not in {text!r}")
    return failures


def load_tools(pack: Any, fake: bool) -> Any:
    rel = pack.ext["staging"]["fake"] if fake else "server/tools.py"
    spec = importlib.util.spec_from_file_location(f"selftest_{uuid.uuid4().hex}", pack.path / rel)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    served, declared = set(module.TOOLS.tools), set(pack.tools)
    if served != declared:
        raise SystemExit(f"{rel} serves {sorted(served)} but the manifest declares {sorted(declared)}")
    return module.TOOLS


def run_case(pack: Any, tools: Any, case: dict[str, Any], variables: dict[str, Any]) -> list[str]:
    failures: list[str] = []
    for number, step in enumerate(case["steps"], start=1):
        where = f"step {number} ({step['tool']})"
        decl = pack.tools[step["tool"]]
        args, expect = substitute(step.get("args") or {}, variables), substitute(step.get("expect") or {}, variables)
        try:
            raw = run_with_capability(tools.tools[step["tool"]].handler, dict(args), None)
        except Exception as exc:  # noqa: BLE001 - the host reports a raising tool as an error
            if not expect.get("is_error"):
                failures.append(f"{where}: raised {type(exc).__name__}: {exc}")
            continue
        problems = schema_errors(raw)[:5]
        if not problems:
            normalized = normalize(raw, tool=decl, category=decl.resolve_category(args))
            problems = [f"receipt violation: {v}" for v in normalized.violations]
            problems += [f"receipt contradiction: {c}" for c in normalized.contradictions]
            problems += check(expect, raw)
            for name, path in (step.get("save") or {}).items():
                try:
                    variables[name] = dig(raw, str(path))
                except (KeyError, IndexError, TypeError, ValueError):
                    problems.append(f"save {name}: the receipt has no {path}")
        failures += [f"{where}: {p}" for p in problems]
    return failures


def main(argv: list[str]) -> int:
    fake = "--real" not in argv
    pack = load_pack(PACK_DIR)
    contract = yaml.safe_load((PACK_DIR / pack.ext["tests"]["contract"]).read_text(encoding="utf-8"))
    variables: dict[str, Any] = {"run": uuid.uuid4().hex[:12]}
    implementation = "fake" if fake else "real"
    passed = failed = 0
    tools = load_tools(pack, fake)
    for case in contract["cases"]:
        if case.get("only") not in (None, implementation):
            continue
        if case.get("env"):  # this case's variables, for a fresh import of the tools, then the old ones again
            saved = dict(os.environ)
            os.environ.update({k: str(substitute(v, variables)) for k, v in case["env"].items()})
            try:
                failures = run_case(pack, load_tools(pack, fake), case, variables)
            finally:
                os.environ.clear()
                os.environ.update(saved)
        else:
            failures = run_case(pack, tools, case, variables)
        passed, failed = passed + (not failures), failed + bool(failures)
        print(f"{'PASS' if not failures else 'FAIL'} {case['name']}")
        for failure in failures:
            print(f"  {failure}")
    print(json.dumps({"pack": pack.name, "implementation": implementation, "passed": passed, "failed": failed}))
    return 0 if passed and not failed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
