"""Honesty checks (flow F4): does a candidate pack do what its manifest says, and no more?

The pack's contract cases run twice, against its fake and against its real implementation
(``capabilities.contract.run_contract``), each host in the platform's own bubblewrap pack
sandbox (``capabilities.mcp_host.sandbox``; no second sandbox) with an empty network
namespace whatever egress the pack declares, and under ``strace -f -ttt -e
trace=%file,%network,%process`` wrapped around bubblewrap. The trace is then read:

- only the pack's processes count: a process that ran ``execve`` of anything but bwrap,
  and every process or thread first seen after that (bubblewrap's own set-up, which opens
  a netlink socket and writes /newroot, is not the pack; its pid 1 only waits after the
  exec). Forks are recognised by first appearance, not by ``clone``'s return value: inside
  the sandbox's PID namespace that is a number of the namespace;
- ``non_local_socket``: any ``socket()`` of a family other than ``AF_UNIX``, whether it
  succeeded or not, at any time;
- ``read_only_wrote``: a write to the file system (open for writing, create, truncate,
  unlink, rename, mkdir, link, chmod, ...; attempts count, ``/dev/`` does not) while a
  step of a tool whose category for that call is ``observe`` ran. A step's window runs
  from just before its request was sent to just after its answer arrived (the client
  stamps both; strace stamps every call with the same clock), so everything the host did
  for that call lies inside it. A write outside every window counts against a pack whose
  tools are all read-only;
- ``invalid_receipt`` / ``receipt_downgraded``: every result must be a valid receipt that
  ``capabilities.receipts.normalize`` passes unchanged (it only ever downgrades: a change
  is a dishonest result), with effects in the declared category;
- ``contract_failed``: a case failed otherwise (the host did not start, an expectation
  did not hold); the details are in the run's record, not in the finding.

Tracing needs ``strace`` and the bubblewrap sandbox (``YIMI_PACK_SANDBOX=bwrap``);
without them the check cannot pass (``tracer_unavailable``, ``sandbox_unavailable``).
"""

from __future__ import annotations

import copy
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from capabilities.contract import ContractHooks, ContractReport, StepRecord, run_contract
from capabilities.manifest import ManifestError, Pack, load_pack
from capabilities.receipts import normalize, schema_errors
from capabilities.registry.checks import Finding

if TYPE_CHECKING:
    from mcp import StdioServerParameters

TRACE_SET = "trace=%file,%network,%process"
LINE = re.compile(r"^(?P<pid>\d+)\s+(?P<time>\d+\.\d+)\s+(?P<rest>.*)$")
CALL = re.compile(r"^(?P<name>[a-z0-9_]+)\((?P<args>.*)\)\s+=\s+(?P<ret>-?\d+|\?|0x[0-9a-f]+)(?P<tail>.*)$")
PATH_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')
WRITE_FLAGS = re.compile(r"\bO_(?:WRONLY|RDWR|CREAT|TRUNC|APPEND|TMPFILE)\b")
OPENS = frozenset({"open", "openat", "openat2", "creat"})
WRITES = frozenset(
    {
        "creat", "unlink", "unlinkat", "rename", "renameat", "renameat2", "mkdir", "mkdirat", "rmdir", "link", "linkat",
        "symlink", "symlinkat", "truncate", "chmod", "fchmodat", "fchmodat2", "chown", "lchown", "fchownat", "mknod",
        "mknodat", "utime", "utimes", "utimensat", "futimesat", "setxattr", "lsetxattr", "removexattr", "lremovexattr",
    }
)
EXEMPT_PREFIXES = ("/dev/",)


@dataclass(frozen=True)
class TraceEvent:
    pid: int
    time: float
    kind: str  # "write" or "socket"
    syscall: str
    detail: str  # the path written, or the socket family


@dataclass
class HonestyReport:
    findings: list[Finding] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.findings and len(self.runs) == 2

    def add(self, code: str, message: str) -> None:
        finding = Finding(code, "", message)
        if finding not in self.findings:
            self.findings.append(finding)

    def as_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "findings": [asdict(f) for f in self.findings], "runs": self.runs}


def honesty_check(pack_dir: Path) -> HonestyReport:
    """Run the contract against the fake and the real implementation, traced (see module doc)."""
    report = HonestyReport()
    strace = shutil.which("strace")
    if strace is None:
        report.add("tracer_unavailable", "strace is not installed (apt-get install strace)")
    if settings.YIMI_PACK_SANDBOX != "bwrap":
        report.add("sandbox_unavailable", "honesty checks run only in the bubblewrap pack sandbox (YIMI_PACK_SANDBOX=bwrap)")
    try:
        pack = load_pack(Path(pack_dir))
    except ManifestError as exc:
        report.add("manifest_invalid", str(exc)[:300])
    if report.findings or strace is None:
        return report
    for fake in (True, False):
        _traced_run(pack, fake, strace, report)
    return report


def _traced_run(pack: Pack, fake: bool, strace: str, report: HonestyReport) -> None:
    implementation = "fake" if fake else "real"
    with tempfile.TemporaryDirectory(prefix=f"yimi-honesty-{pack.name}-") as tmp:
        traces: list[Path] = []
        steps: list[StepRecord] = []

        def wrap(params: StdioServerParameters) -> StdioServerParameters:
            from mcp import StdioServerParameters  # here: the MCP SDK costs ~1 s of a start (test_startup_imports)

            out = Path(tmp) / f"trace-{len(traces)}.txt"
            traces.append(out)
            args = ["-f", "-qq", "-ttt", "-o", str(out), "-e", TRACE_SET, params.command, *params.args]
            return StdioServerParameters(command=strace, args=args, env=params.env, cwd=params.cwd)

        contract = run_contract(pack.path, fake=fake, hooks=ContractHooks(wrap=wrap, on_step=steps.append, no_network=True))
        events = [event for trace in traces for event in pack_events(trace.read_text(encoding="utf-8", errors="replace"))]
    report.runs.append(_run_record(contract, steps, events))
    if contract.errors:
        report.add("contract_failed", f"{implementation}: the contract could not run")
    for case in contract.cases:
        if not case.passed:
            report.add("contract_failed", f"{implementation}: case {case.name!r} failed ({len(case.failures)} problem(s))")
    _judge_events(pack, implementation, steps, events, report)
    for step in steps:
        problem = receipt_honesty(pack, step)
        if problem is not None:
            report.add(problem[0], f"{implementation}: {step.tool} {problem[1]}")


def receipt_honesty(pack: Pack, step: StepRecord) -> tuple[str, str] | None:
    """(code, why) when a step's result is not a receipt that validation passes unchanged."""
    if step.is_error:
        return None  # the host reported an error: the contract says whether one was expected
    if step.raw is None or schema_errors(step.raw):
        return ("invalid_receipt", "returned something that is not a valid receipt")
    decl = pack.tools[step.tool]
    category = decl.resolve_category(step.args)
    expected = copy.deepcopy(step.raw)
    for effect in expected.get("effects", []):
        if effect.get("category") not in (None, category):
            return ("receipt_downgraded", f"reported an effect in another category than the declared {category}")
        effect["category"] = category
    normalized = normalize(step.raw, tool=decl, category=category)
    if normalized.violations or normalized.contradictions or normalized.receipt != expected:
        return ("receipt_downgraded", "returned a receipt that validation had to downgrade")
    return None


def _judge_events(pack: Pack, implementation: str, steps: list[StepRecord], events: list[TraceEvent], report: HonestyReport) -> None:
    all_read_only = all(t.spec.get("effect") == "observe" for t in pack.tools.values())
    for event in events:
        step = next((s for s in steps if s.started <= event.time <= s.finished), None)
        where = f"{step.tool}" if step else "start-up"
        if event.kind == "socket":
            report.add("non_local_socket", f"{implementation}: {where} opened a {event.detail} socket")
            continue
        read_only = pack.tools[step.tool].resolve_category(step.args) == "observe" if step else all_read_only
        if read_only:
            report.add("read_only_wrote", f"{implementation}: {where} is declared read-only but {event.syscall} wrote {event.detail}")


def pack_events(trace: str) -> list[TraceEvent]:
    """The writes and non-local sockets of the pack's processes in one strace -f -ttt output."""
    pending: dict[int, tuple[float, str]] = {}
    pack_pids: set[int] = set()
    seen: set[int] = set()
    events: list[TraceEvent] = []
    for line in trace.splitlines():
        match = LINE.match(line)
        if match is None:
            continue
        pid, when, rest = int(match["pid"]), float(match["time"]), match["rest"]
        if pid not in seen:
            seen.add(pid)
            if pack_pids:
                pack_pids.add(pid)  # a process or thread the pack started
        if rest.endswith("<unfinished ...>"):
            pending[pid] = (when, rest[: -len("<unfinished ...>")].rstrip())
            continue
        resumed = re.match(r"^<\.\.\. [a-z0-9_]+ resumed>\s?(.*)$", rest)
        if resumed:
            if pid not in pending:
                continue
            when, head = pending.pop(pid)
            rest = head + resumed.group(1)
        call = CALL.match(rest)
        if call is None:
            continue
        name, args, ret = call["name"], call["args"], call["ret"]
        if name == "execve" and ret == "0":
            program = PATH_ARG.search(args)
            if program and not program.group(1).endswith("/bwrap"):
                pack_pids.add(pid)
            continue
        if pid not in pack_pids:
            continue
        if name in ("socket", "socketpair"):
            family = args.split(",", 1)[0].strip()
            if family not in ("AF_UNIX", "AF_LOCAL"):
                events.append(TraceEvent(pid, when, "socket", name, family))
            continue
        if name in OPENS and name != "creat" and not WRITE_FLAGS.search(args):
            continue
        if name not in OPENS and name not in WRITES:
            continue
        path_match = PATH_ARG.search(args)
        path = path_match.group(1) if path_match else "(a descriptor)"
        if path.startswith(EXEMPT_PREFIXES):
            continue
        events.append(TraceEvent(pid, when, "write", name, path))
    return events


def _run_record(contract: ContractReport, steps: list[StepRecord], events: list[TraceEvent]) -> dict[str, Any]:
    return {
        "implementation": contract.implementation,
        "passed": contract.passed,
        "errors": [e[:500] for e in contract.errors],
        "cases": [{"name": c.name, "passed": c.passed, "failures": [f[:300] for f in c.failures[:5]]} for c in contract.cases],
        "skipped": contract.skipped,
        "steps": len(steps),
        "traced_events": len(events),
    }
