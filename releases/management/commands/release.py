"""``manage.py release build|gate|switch|rollback|status|cleanup`` — the operator's side of
flows F5/F6 on a host without Docker (directory releases under ``YIMI_RELEASES_ROOT``).

- ``build [--repo DIR] [--ref REF] [--base COMMIT] [--venv lock|shared]``: a release
  directory for REF (default HEAD of this checkout), made on the live commit unless
  ``--base`` says otherwise; a candidate touching the protected baseline opens its card
  on the owner's phone now (``releases.baseline``; gate and switch check again);
- ``gate BUILD [--suite NAME=ARGS]``: the candidate's suites and the live base's, offline
  in bubblewrap, each with a data directory of its own; ``F_cand \\ F_base`` must be
  empty; a suite that failed is shown with its last lines;
- ``switch BUILD [--idle-timeout S]``: protected-baseline card answered, base re-checked,
  idle waited for, backup, pointers, start, verify (services from
  ``<root>/services.json``); back to the previous release when it does not verify;
- ``rollback --reason TEXT``: queues the owner's rollback request (executed at the next
  idle moment by ``releases.tasks``); ``--now`` goes back at once instead;
- ``status``: the pointers, the latest releases and history, what blocks a switch now;
- ``cleanup``: every release directory but ``current`` and ``previous`` removed.

BUILD is a build id, a unique prefix of one (``dir:3fa2…``, or without ``dir:``), or a
release directory's name. Every error is one line with its code, never a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Q

from accounts.services import get_owner
from releases import builds, gate, idle, pointers, processes, requested, switching
from releases.models import Release, ReleaseEvent
from releases.request_models import RollbackRequest
from yimi_project.errors import YimiError


def find_release(ref: str) -> Release:
    """The release ``ref`` names (see the module docstring); ambiguous or unknown: a clear error."""
    ref = ref.strip()
    exact = Release.objects.filter(Q(build_id=ref) | Q(path__endswith="/" + ref)).first()
    if exact is not None:
        return exact
    prefix = ref if ref.startswith(("dir:", "sha256:")) else f"dir:{ref}"
    found = list(Release.objects.filter(build_id__startswith=prefix)[:2])
    if len(found) == 1:
        return found[0]
    if not found:
        raise YimiError("not_found", f"no release {ref!r} (manage.py release status lists them)")
    raise YimiError("invalid_request", f"{ref!r} names more than one release: give more of the build id")


def parse_suite(text: str) -> gate.Suite:
    name, _, args = text.partition("=")
    if not name.strip() or not args.strip():
        raise YimiError("invalid_request", f"--suite {text!r}: write NAME=PYTEST ARGS, e.g. gateway=tests/capabilities/test_gateway.py")
    return gate.Suite(name.strip(), tuple(args.split()))


class Command(BaseCommand):
    help = "Build, gate, switch, roll back, show and clean up releases of this platform (flows F5/F6)."

    def add_arguments(self, parser: Any) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        b = sub.add_parser("build", help="build a release directory from a commit")
        b.add_argument("--repo", default=str(settings.BASE_DIR), help="the git repository (default: this checkout)")
        b.add_argument("--ref", default="HEAD", help="the commit to build (default HEAD)")
        b.add_argument("--base", default=None, help="the live commit the candidate was made on (default: current's)")
        b.add_argument("--venv", choices=sorted(builds.VENV_BUILDERS), default="lock",
                       help="lock: a venv from the commit's requirements.lock and requirements-dev.lock (default); shared: a venv on this interpreter's packages")
        g = sub.add_parser("gate", help="run the candidate's and the live base's suites offline; no new failure may appear")
        g.add_argument("build")
        g.add_argument("--suite", action="append", default=[], help="NAME=PYTEST ARGS (repeatable; default tests=tests)")
        s = sub.add_parser("switch", help="switch a gated release in at the next idle moment")
        s.add_argument("build")
        s.add_argument("--idle-timeout", type=float, default=0.0, help="seconds to wait for idle (default 0: refuse when busy)")
        r = sub.add_parser("rollback", help="go back to the previous release (queued as the owner's request)")
        r.add_argument("--reason", required=True, help="why (the owner's words when they asked)")
        r.add_argument("--now", action="store_true", help="roll back immediately instead of queueing a request")
        sub.add_parser("status", help="the pointers, releases, history and idle conditions")
        sub.add_parser("cleanup", help="remove every release but current and previous")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            getattr(self, "_" + opts["action"])(opts)
        except YimiError as exc:
            raise CommandError(f"{exc.message} ({exc.code})") from None

    def _say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()

    def _build(self, opts: dict[str, Any]) -> None:
        release = builds.build_directory_release(
            Path(opts["repo"]), opts["ref"], base_commit=opts["base"], make_venv=builds.VENV_BUILDERS[opts["venv"]],
            progress=lambda line: self._say(f"  {line}"),
        )
        self._say(f"built {release.build_id}")
        self._say(f"  commit {release.commit}  base {release.base_commit or '(none)'}  state {release.state}")
        self._say(f"  {release.path}")

    def _gate(self, opts: dict[str, Any]) -> None:
        release = find_release(opts["build"])
        suites = tuple(parse_suite(s) for s in opts["suite"]) or gate.DEFAULT_SUITES
        base = pointers.read_pointers().current
        self._say(f"gating {release.build_id} against {base.build_id if base else 'no live release (F_base is empty)'}")
        result = gate.run_gate(release, base, suites=suites, progress=lambda line: self._say(f"  {line}"))
        self._say(("passed: " if result.passed else "rejected: ") + result.reason())
        for name in result.new_failures:
            self._say(f"  new failure: {name}")
        for run in result.explained_runs():
            why = f": {run['problem']}" if run["problem"] else ""
            self._say(f"{run['side']} suite {run['suite']} exited {run['exit_code']}{why}; its last lines:")
            for line in (run["output"] or "(it printed nothing)").splitlines():
                self._say(f"  | {line}")
        if not result.passed:
            raise CommandError(f"the gate rejected {release.build_id} (gate_rejected)")

    def _switch(self, opts: dict[str, Any]) -> None:
        release = find_release(opts["build"])
        root = pointers.releases_root()
        services = processes.load_services(root)
        result = switching.switch_release(
            release, services=services, root=root, idle_timeout=opts["idle_timeout"], progress=lambda line: self._say(f"  {line}")
        )
        self._say(result.summary())
        if result.backup:
            self._say(f"  backup: {result.backup}")
        if not result.ok:
            raise CommandError(f"the switch to {release.build_id} did not take ({result.state})")

    def _rollback(self, opts: dict[str, Any]) -> None:
        root = pointers.releases_root()
        if opts["now"]:
            result = switching.rollback_release(opts["reason"], services=processes.load_services(root), root=root)
            self._say(result.summary())
            self._say("  only code and configuration were replaced: the database was not restored, nothing done outside was undone")
            if not result.ok:
                raise CommandError("the rollback did not verify; it is not tried again (rollback_failed)")
            return
        owner = get_owner()
        if owner is None:
            raise YimiError("no_owner", "there is no owner account to make the request for")
        request = requested.request_rollback(owner, opts["reason"], root=root)
        self._say(f"rollback request {request.id} queued ({request.state}) from {request.from_build or '(no current release)'}")
        self._say("  it runs at the next idle moment, only while that build is still current and the latest switch")

    def _status(self, opts: dict[str, Any]) -> None:
        root = pointers.releases_root()
        self._say(f"releases root: {root}")
        try:
            now = pointers.read_pointers(root)
        except YimiError as exc:
            self._say(f"  pointers unreadable: {exc.message}")
            now = pointers.Pointers(None, None)
        for name, target in (("current", now.current), ("previous", now.previous)):
            if target is None:
                self._say(f"{name:9} (none)")
            else:
                row = Release.objects.filter(build_id=target.build_id).first()
                self._say(f"{name:9} {target.build_id}  commit {target.commit[:12]}  {row.state if row else '(no record)'}")
        self._say("releases:")
        for release in Release.objects.all()[:10]:
            self._say(f"  {release.created_at:%Y-%m-%d %H:%M}  {release.build_id[:20]}…  {release.commit[:12]}  {release.state:11}  {release.state_reason[:80]}")
        self._say("history:")
        for event in ReleaseEvent.objects.all()[:10]:
            move = f"{event.from_build[:16] or '-'} -> {event.to_build[:16] or '-'}"
            self._say(f"  {event.at:%Y-%m-%d %H:%M:%S}  {event.kind:18} {move:38} {event.reason[:80]}")
        waiting = RollbackRequest.objects.filter(state=RollbackRequest.State.PENDING).count()
        self._say(f"rollback requests waiting: {waiting}")
        blockers = idle.blockers(root=root)
        self._say("idle: yes" if not blockers else "idle: no — " + "; ".join(str(b) for b in blockers))

    def _cleanup(self, opts: dict[str, Any]) -> None:
        removed = builds.cleanup(progress=lambda line: self._say(f"  {line}"))
        self._say(f"removed {len(removed)} release director{'y' if len(removed) == 1 else 'ies'}; current and previous kept")
