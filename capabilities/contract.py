"""Contract tests for capability packs: the real server and the fake answer alike.

``run_contract(pack_dir, fake=...)`` starts the pack's host as a sandboxed subprocess
(``python -m capabilities.mcp_host.host --packs-dir <parent> --select <pack> [--fake]``
inside ``capabilities.mcp_host.sandbox``, with only what the pack declares), connects
with the MCP client and runs the cases of the pack's contract file (``tests.contract``
in plugin.json). Every run gets fresh temporary directories, so the real server and the
fake both start empty. A pack with a ``platform_api`` calls the platform's internal socket
with a capability minted per step (``owner_id``: whom it acts for).

Contract file (YAML)::

    pack: schedule                  # optional; must equal the pack's name
    timeout: 30                     # optional; seconds per step (default 30)
    cases:
      - name: create then cancel    # required, unique
        only: real                  # optional: run against the real server only (or: fake)
        env: {YIMI_PLATFORM_SOCKET: "/nonexistent/yimi.sock"}
                                    # optional: this case runs in its own host with these
                                    # variables added
        steps:
          - tool: create_reminder   # the tool's name in the manifest (without "pack__")
            args: {text: hi, due_at: "2099-01-01T09:00:00+00:00"}
            save: {rid: content.items.0.id}   # optional: variables from the raw receipt
                                              # (dotted path, list indexes as numbers)
            expect: {...}           # see below

Variables: ``${name}`` in args, expect and env is replaced by a saved value (a string that
is exactly ``${name}`` takes the value with its type). Built in: ``${run}`` (unique per
run, for idempotency keys) and ``${free_port}`` (a loopback port nobody listens on).

``expect`` keys (all optional; dicts match as subsets, recursively; ``true``/``false``
never equal ``1``/``0``):

- ``status``: the receipt's status, exactly.
- ``effects`` / ``values``: a list of dicts; each must match some effect / value. An
  empty list means the receipt has none.
- ``content_text`` (exact) / ``content_text_contains`` (substring) of ``content.text``.
- ``content_items``: each dict must match some item of ``content.items``;
  ``content_items_absent``: none may match any item; ``content_items_count``: how many.
- ``summary_contains``: a substring of ``summary``.
- ``error_code``: ``error.code`` (``null``: no error).
- ``retry``, ``check_with``, ``waiting_on``: the fields of ``next`` (``null``: absent).
- ``unknowns_count``: how many ``unknowns``.
- ``is_error``: true when the host itself must report an error (no receipt).

Every step's raw result must also be a receipt: valid against the receipt schema
(``capabilities.receipts.schema_errors``) and without violations or contradictions once
normalized (a number without a unit, a success with unverified effects, ...). Failures are
collected per step; the other steps of a case still run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from django.conf import settings

from capabilities.egress import rules_from_declaration
from capabilities.manifest import ManifestError, Pack, load_pack
from capabilities.mcp_host import limits as pack_limits
from capabilities.mcp_host.sandbox import PackGrant, PlatformPaths, grant_for, host_parameters
from capabilities.receipts import normalize, schema_errors
from yimi_project import call_capability

if TYPE_CHECKING:
    from mcp import ClientSession, StdioServerParameters

DEFAULT_STEP_TIMEOUT = 30.0
STARTUP_TIMEOUT = 60.0
EXPECT_KEYS = {
    "status", "effects", "values", "content_text", "content_text_contains", "content_items", "content_items_absent",
    "content_items_count", "summary_contains", "error_code", "retry", "check_with", "waiting_on", "unknowns_count", "is_error",
}
STEP_KEYS = {"tool", "args", "save", "expect"}
CASE_KEYS = {"name", "only", "env", "steps"}
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass
class CaseResult:
    name: str
    passed: bool
    failures: list[str] = field(default_factory=list)


@dataclass
class ContractReport:
    pack: str
    fake: bool
    cases: list[CaseResult] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # cases for the other implementation
    errors: list[str] = field(default_factory=list)  # the contract could not run at all

    @property
    def passed(self) -> bool:
        return not self.errors and bool(self.cases) and all(c.passed for c in self.cases)

    @property
    def implementation(self) -> str:
        return "fake" if self.fake else "real"


class ContractFormatError(Exception):
    pass


@dataclass(frozen=True)
class StepRecord:
    """One executed step, for an observer of the run (the registry's honesty check):
    wall-clock times taken just before the request was sent and just after the answer
    arrived, so everything the host did for this call happened between them."""

    case: str
    tool: str
    args: dict[str, Any]
    started: float
    finished: float
    raw: Any
    is_error: bool


@dataclass
class ContractHooks:
    """How an observer watches a run: ``wrap`` rewrites each host's command line (e.g. to
    run it under strace), ``on_step`` sees every executed step, and ``no_network`` keeps
    the host in an empty network namespace even when the pack declares egress."""

    wrap: Callable[[StdioServerParameters], StdioServerParameters] | None = None
    on_step: Callable[[StepRecord], None] | None = None
    no_network: bool = False


def run_contract(
    pack_dir: Path,
    *,
    fake: bool,
    env: dict[str, str] | None = None,
    paths: PlatformPaths | None = None,
    owner_id: int | None = None,
    hooks: ContractHooks | None = None,
) -> ContractReport:
    """Run the pack's contract against its real server (or its fake) and report per case.

    The host runs sandboxed with what the pack declares, as the platform runs it. Unless
    ``paths`` says otherwise, every run gets fresh temporary directories (workspace, mail
    store, data directory), so the real server and the fake both start empty. A pack with
    a ``platform_api`` reaches the platform's internal socket; each step carries a
    capability minted for that step's call as the gateway would (acting for ``owner_id``).
    ``env`` adds variables (e.g. ``YIMI_SHOP_PRICE_DRIFT``).
    """
    pack_dir = Path(pack_dir).resolve()
    report = ContractReport(pack=pack_dir.name, fake=fake)
    try:
        pack = load_pack(pack_dir)
        contract = load_contract(pack)
    except (ManifestError, ContractFormatError) as exc:
        report.errors.append(str(exc))
        return report
    report.pack = pack.name
    with tempfile.TemporaryDirectory(prefix=f"yimi-contract-{pack.name}-") as tmp:
        paths = paths or PlatformPaths(
            data_dir=Path(tmp) / "data", workspace_dir=Path(tmp) / "workspace", mail_dir=Path(tmp) / "mail",
            secrets_dir=Path(settings.SECRETS_DIR), internal_socket=Path(settings.YIMI_INTERNAL_SOCKET),
        )
        grant = grant_for([pack], paths)
        grant.env.update(env or {})
        hooks = hooks or ContractHooks()
        if hooks.no_network:
            grant.egress = []
        asyncio.run(_run(pack, contract, fake, grant, Path(tmp), report, owner_id, hooks))
    return report


def load_contract(pack: Pack) -> dict[str, Any]:
    path = pack.path / pack.ext["tests"]["contract"]
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ContractFormatError(f"{path.name}: cannot read the contract ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list) or not data["cases"]:
        raise ContractFormatError(f"{path.name}: expected a mapping with a non-empty list 'cases'")
    if data.get("pack", pack.name) != pack.name:
        raise ContractFormatError(f"{path.name}: the contract is for {data['pack']!r}, not {pack.name!r}")
    names = set()
    for i, case in enumerate(data["cases"]):
        where = f"{path.name}: case {i}"
        if not isinstance(case, dict) or not isinstance(case.get("name"), str) or not isinstance(case.get("steps"), list):
            raise ContractFormatError(f"{where}: a case needs a name and a list of steps")
        if case["name"] in names:
            raise ContractFormatError(f"{where}: the name {case['name']!r} is used twice")
        names.add(case["name"])
        if set(case) - CASE_KEYS or case.get("only") not in (None, "real", "fake"):
            raise ContractFormatError(f"{where}: unknown keys {sorted(set(case) - CASE_KEYS)} or only not real/fake")
        if "env" in case and not (isinstance(case["env"], dict) and all(isinstance(v, str) for v in case["env"].values())):
            raise ContractFormatError(f"{where}: env maps names to strings")
        for j, step in enumerate(case["steps"]):
            if not isinstance(step, dict) or step.get("tool") not in pack.tools:
                raise ContractFormatError(f"{where} step {j}: tool must be one of {sorted(pack.tools)}")
            unknown = set(step) - STEP_KEYS or set(step.get("expect") or {}) - EXPECT_KEYS
            if unknown:
                raise ContractFormatError(f"{where} step {j}: unknown keys {sorted(unknown)}")
            if not isinstance(step.get("args", {}), dict) or not isinstance(step.get("save", {}), dict):
                raise ContractFormatError(f"{where} step {j}: args and save are mappings")
    return data


class _Host:
    """One sandboxed pack host subprocess and its client session."""

    def __init__(self, pack: Pack, fake: bool, grant: PackGrant, errlog_path: Path, hooks: ContractHooks | None = None) -> None:
        self.pack, self.fake, self.grant, self.errlog_path = pack, fake, grant, errlog_path
        self.hooks = hooks or ContractHooks()
        self.stack = contextlib.AsyncExitStack()
        self.session: ClientSession | None = None
        self.problem: str | None = None

    async def start(self) -> None:
        from mcp import ClientSession, stdio_client  # here: the MCP SDK costs ~1 s of a start (test_startup_imports)

        limits = pack_limits.for_packs([self.pack])  # its rlimits, as on the platform (no cgroup for a contract run)
        args = ["-m", "capabilities.mcp_host.host", "--packs-dir", str(self.pack.path.parent), "--select", self.pack.name,
                *pack_limits.host_arguments(limits)]
        if self.fake:
            args.append("--fake")
        errlog = self.stack.enter_context(open(self.errlog_path, "a", encoding="utf-8"))
        try:
            params = host_parameters(args, self.grant, readable=[self.pack.path.parent], tmp_bytes=limits.memory_mib * pack_limits.MiB)
            if self.hooks.wrap is not None:
                params = self.hooks.wrap(params)
            read, write = await self.stack.enter_async_context(stdio_client(params, errlog=errlog))
            self.session = await self.stack.enter_async_context(ClientSession(read, write))
            await asyncio.wait_for(self.session.initialize(), STARTUP_TIMEOUT)
            listed = await asyncio.wait_for(self.session.list_tools(), STARTUP_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - reported as the reason nothing ran
            self.problem = f"the host did not start ({type(exc).__name__}: {exc}){self._stderr()}"
            return
        served = {t.name for t in listed.tools}
        missing = sorted(t.full_name for t in self.pack.tools.values() if t.full_name not in served)
        if missing:
            self.problem = f"the host does not serve {missing}{self._stderr()}"

    def _stderr(self) -> str:
        try:
            text = self.errlog_path.read_text(encoding="utf-8").strip()
        except OSError:
            return ""
        return f"; host stderr: {text[-1500:]}" if text else ""

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.stack.aclose()


async def _run(
    pack: Pack, contract: dict[str, Any], fake: bool, grant: PackGrant, tmp: Path, report: ContractReport, owner_id: int | None,
    hooks: ContractHooks,
) -> None:
    variables: dict[str, Any] = {"run": uuid.uuid4().hex[:12]}
    step_timeout = float(contract.get("timeout", DEFAULT_STEP_TIMEOUT))
    shared: _Host | None = None
    try:
        for index, case in enumerate(contract["cases"]):
            if case.get("only") not in (None, report.implementation):
                report.skipped.append(case["name"])
                continue
            if case.get("env"):
                if "free_port" not in variables:
                    variables["free_port"] = _free_port()
                try:
                    extra = {k: str(substitute(v, variables)) for k, v in case["env"].items()}
                except KeyError as exc:
                    report.cases.append(CaseResult(case["name"], False, [f"env: unknown variable {exc}"]))
                    continue
                case_env = {**grant.env, **extra}
                # a case that sets a declared secret (an unreachable URL) reaches what it now says
                egress = rules_from_declaration(pack.egress, case_env.get) if not hooks.no_network else []
                host = _Host(pack, fake, replace(grant, env=case_env, egress=egress), tmp / f"host-{index}.log", hooks)
                await host.start()
                try:
                    report.cases.append(await _run_case(host, pack, case, variables, step_timeout, owner_id, hooks))
                finally:
                    await host.close()
                continue
            if shared is None:
                shared = _Host(pack, fake, grant, tmp / "host.log", hooks)
                await shared.start()
            report.cases.append(await _run_case(shared, pack, case, variables, step_timeout, owner_id, hooks))
    finally:
        if shared is not None:
            await shared.close()


def step_capability(pack: Pack, decl: Any, args: dict[str, Any], owner_id: int | None, run: str = "") -> str | None:
    """What the gateway would hand the pack for this call: a capability for a call of
    this tool, its category and target, for the owner (packs with a platform_api only).
    Each case is one run (``run``), each step one call."""
    if not pack.platform_api:
        return None
    claims = {
        "call": f"contract-{uuid.uuid4()}", "run": run or f"contract-{uuid.uuid4()}", "owner": owner_id, "pack": pack.name, "tool": decl.full_name,
        "category": decl.resolve_category(args), "target": decl.target_arguments(args), "apis": pack.platform_api,
    }
    return call_capability.mint(call_capability.PACK, claims, ttl_seconds=STARTUP_TIMEOUT + DEFAULT_STEP_TIMEOUT)


async def _run_case(
    host: _Host, pack: Pack, case: dict[str, Any], variables: dict[str, Any], step_timeout: float, owner_id: int | None,
    hooks: ContractHooks | None = None,
) -> CaseResult:
    if host.problem or host.session is None:
        return CaseResult(case["name"], False, [f"not run: {host.problem}"])
    failures: list[str] = []
    run = f"contract-{uuid.uuid4()}"
    for number, step in enumerate(case["steps"], start=1):
        decl = pack.tools[step["tool"]]
        where = f"step {number} ({step['tool']})"
        try:
            args = substitute(step.get("args") or {}, variables)
            expect = substitute(step.get("expect") or {}, variables)
        except KeyError as exc:
            failures.append(f"{where}: unknown variable {exc}")
            continue
        try:
            capability = step_capability(pack, decl, args, owner_id, run)
            meta: Any = {call_capability.META_KEY: capability} if capability else None
            started = time.time()
            result = await asyncio.wait_for(host.session.call_tool(decl.full_name, args, meta=meta), step_timeout)
            if hooks is not None and hooks.on_step is not None:
                raw_result = getattr(result, "structured_content", None)
                hooks.on_step(StepRecord(case["name"], step["tool"], args, started, time.time(), raw_result, bool(getattr(result, "is_error", False))))
        except TimeoutError:
            failures.append(f"{where}: no answer within {step_timeout:g} s")
            continue
        except Exception as exc:  # noqa: BLE001 - a broken transport fails the step
            failures.append(f"{where}: the call failed ({type(exc).__name__}: {exc})")
            continue
        if getattr(result, "is_error", False):
            if not expect.get("is_error"):
                failures.append(f"{where}: the host reported an error: {_text_of(result)}")
            continue
        if expect.get("is_error"):
            failures.append(f"{where}: expected the host to report an error, got a result")
            continue
        raw = getattr(result, "structured_content", None)
        failures.extend(f"{where}: {problem}" for problem in receipt_problems(raw, decl, args))
        if schema_errors(raw):
            continue
        failures.extend(f"{where}: {problem}" for problem in check_expect(expect, raw))
        for name, path in (step.get("save") or {}).items():
            found, saved = _dig(raw, str(path))
            if found:
                variables[name] = saved
            else:
                failures.append(f"{where}: save {name}: the receipt has no {path}")
    return CaseResult(case["name"], not failures, failures)


def receipt_problems(raw: Any, decl: Any, args: dict[str, Any]) -> list[str]:
    """Why a raw result is not a proper receipt: schema errors, then the violations and
    contradictions normalization finds."""
    if raw is None:
        return ["the result carries no receipt (structured_content is empty)"]
    errors = schema_errors(raw)
    if errors:
        return [f"not a valid receipt: {e}" for e in errors[:5]]
    normalized = normalize(raw, tool=decl, category=decl.resolve_category(args))
    return [f"receipt violation: {v}" for v in normalized.violations] + [f"receipt contradiction: {c}" for c in normalized.contradictions]


def check_expect(expect: dict[str, Any], receipt: dict[str, Any]) -> list[str]:
    failures: list[str] = []
    nxt, error, content = receipt.get("next", {}), receipt.get("error"), receipt.get("content", {})
    items = content.get("items", [])

    def differs(label: str, expected: Any, actual: Any) -> None:
        if not matches(expected, actual):
            failures.append(f"{label}: expected {_show(expected)}, got {_show(actual)}")

    if "status" in expect:
        differs("status", expect["status"], receipt["status"])
    for key in ("effects", "values"):
        if key in expect:
            failures.extend(_contains(key, expect[key], receipt.get(key, [])))
    if "content_text" in expect:
        differs("content.text", expect["content_text"], content.get("text"))
    if "content_text_contains" in expect and str(expect["content_text_contains"]) not in str(content.get("text", "")):
        failures.append(f"content.text: {expect['content_text_contains']!r} not in {_show(content.get('text'))}")
    if "content_items" in expect:
        failures.extend(_contains("content.items", expect["content_items"], items, empty_means_none=False))
    for absent in expect.get("content_items_absent", []):
        hit = next((i for i in items if matches(absent, i)), None)
        if hit is not None:
            failures.append(f"content.items: expected nothing matching {_show(absent)}, found {_show(hit)}")
    if "content_items_count" in expect:
        differs("len(content.items)", expect["content_items_count"], len(items))
    if "summary_contains" in expect and str(expect["summary_contains"]) not in receipt.get("summary", ""):
        failures.append(f"summary: {expect['summary_contains']!r} not in {_show(receipt.get('summary'))}")
    if "error_code" in expect:
        differs("error.code", expect["error_code"], error.get("code") if isinstance(error, dict) else None)
    for key in ("retry", "check_with", "waiting_on"):
        if key in expect:
            differs(f"next.{key}", expect[key], nxt.get(key))
    if "unknowns_count" in expect:
        differs("len(unknowns)", expect["unknowns_count"], len(receipt.get("unknowns", [])))
    return failures


def _contains(label: str, expected: Any, actual: list[Any], empty_means_none: bool = True) -> list[str]:
    if not isinstance(expected, list):
        return [f"{label}: the expectation must be a list"]
    if not expected:
        return [] if not empty_means_none or not actual else [f"{label}: expected none, got {_show(actual)}"]
    return [f"{label}: nothing matches {_show(e)} in {_show(actual)}" for e in expected if not any(matches(e, a) for a in actual)]


def matches(expected: Any, actual: Any) -> bool:
    """``expected`` is a subset of ``actual``: dict keys recursively, lists element-wise,
    scalars equal (booleans only equal booleans)."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(k in actual and matches(v, actual[k]) for k, v in expected.items())
    if isinstance(expected, list):
        return isinstance(actual, list) and len(expected) == len(actual) and all(matches(e, a) for e, a in zip(expected, actual))
    if isinstance(expected, bool) or isinstance(actual, bool):
        return isinstance(expected, bool) and isinstance(actual, bool) and expected == actual
    return expected == actual


def substitute(value: Any, variables: dict[str, Any]) -> Any:
    """Replace ``${name}`` in strings (recursively); KeyError for an unknown name."""
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


def _dig(data: Any, path: str) -> tuple[bool, Any]:
    for part in path.split("."):
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            return False, None
    return True, data


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _text_of(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in getattr(result, "content", []) or [])[:500]


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 300 else text[:297] + "..."
