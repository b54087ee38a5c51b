"""Workshop builds (flow F4): build, self-test in the sandbox, repair, hand to the registry.

A build is a ``WorkshopBuild`` row. ``start_build(spec)`` records it and runs it off the
caller's path (a Celery task with a broker, else a thread of this process);
``build_candidate(source)`` runs one at once, for ``manage.py pack build``. Both run
``execute_build``, which claims the row (``queued`` → ``building``, compare-and-set: a
second worker that loses the race leaves it alone) and then, per attempt, up to
``max_attempts``:

1. **build**: copy and fill the template from the spec (``workshop.drafts``) into a fresh
   directory ``<YIMI_WORKSHOP_DIR>/builds/<id>/attempt-<n>/<name>``; a build from a pack
   draft copies the draft instead;
2. **static checks** (the registry's, ``capabilities.registry.checks``), so a pack that
   would be refused for its layout goes back to the build step at once;
3. **self-test**: ``python3 scripts/test.py`` (the contract cases against the fake) in the
   workshop sandbox (``workshop.sandbox``: read-only root, no data or secrets, own network,
   256 MiB, 0.5 CPU, 128 processes). Its output's tail is kept in ``log_tail``;
4. passed → ``capabilities.registry.add_candidate(dir, origin="workshop",
   built_against=<digest online when the build started, or None>)``; the build names the
   candidate (``candidate_digest``, ``candidate_state``: the registry's verdict);
   failed → back to the build step: the repair step (``workshop.repair``, the
   ``workshop_repair`` model) revises the spec from the failure, and the next attempt
   starts; after the last attempt the build fails with ``selftest_failed``;
5. **publish** (Yimi's builds: ``start_build`` and the Celery task): a candidate that
   passed the registry's checks goes online at once with ``registry.publish`` (flow F4:
   no staging and no go-live confirmation for a Yimi-built pack; the registry's checks,
   the sandbox, the runtime gates and monitoring are what guard it). The publish compares
   the online version with ``built_against``: if it changed meanwhile the build fails
   ``online_version_changed`` and nothing is published; any other refusal
   (``preload_failed``, ``activation_failed``) ends it the same way, with the registry's
   code and message. A refused candidate fails the build ``candidate_refused``. A build
   that succeeds is live: ``published_version(build)`` says which version and whether it
   is still the one online. ``build_candidate`` (``manage.py pack build``) stops before
   this step: the operator publishes with ``manage.py pack publish``.

A build from a pack draft has no spec to repair: it gets one attempt. ``sandbox_unavailable``
(the limits cannot be enforced) fails the build at once; nothing ran. So does
``secret_not_granted`` (the pack declares a secret that was not granted to it: no repair can
grant one; the owner does, ``manage.py pack grant``).
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections, transaction
from django.utils import timezone

from capabilities import registry
from capabilities.registry.checks import check_pack
from capabilities.registry.grants import NOT_GRANTED
from capabilities.registry_models import PackCandidate, PackVersion
from workshop.drafts import fill_template, validate_spec
from workshop.find import find_entry
from workshop.models import WorkshopBuild
from workshop.repair import Repair, model_repair
from workshop.sandbox import run_sandboxed
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

SPEC_FILE = "build.json"
LOG_TAIL_CHARS = 4000
MAX_ATTEMPTS_CEILING = 10


def _quiet(_line: str) -> None:
    pass


# --- starting -------------------------------------------------------------------------------------


def start_build(spec: dict[str, Any], *, max_attempts: int | None = None) -> WorkshopBuild:
    """Record a build of ``spec`` (checked first: ``invalid_spec``) and start it after the
    current transaction commits: on a Celery worker with a broker, else on a thread."""
    validate_spec(spec)
    _reuse_source(spec)
    build = WorkshopBuild.objects.create(spec=spec, max_attempts=_attempts(max_attempts))

    def start() -> None:
        if settings.CELERY_BROKER_URL:
            from workshop.tasks import run_build_task

            run_build_task.delay(str(build.id))
        else:
            threading.Thread(target=_build_in_thread, args=(build.id,), daemon=True, name="workshop-build").start()

    transaction.on_commit(start)
    return build


def _build_in_thread(build_id: Any) -> None:
    try:
        execute_build(build_id)
    finally:
        close_old_connections()


def _attempts(requested: int | None) -> int:
    value = settings.YIMI_WORKSHOP_MAX_ATTEMPTS if requested is None else requested
    if not 1 <= value <= MAX_ATTEMPTS_CEILING:
        raise YimiError("invalid_request", f"max_attempts is 1 to {MAX_ATTEMPTS_CEILING}")
    return value


def build_candidate(source: Path, *, progress: Callable[[str], None] = _quiet) -> PackCandidate:
    """Build what ``source`` holds and hand it to the registry; the candidate.

    ``source`` is a directory holding a build spec (``build.json``) or a pack draft
    (``plugin.json``: built as it is, one attempt). Runs at once, in this process, with
    ``progress`` told each step. Raises ``YimiError`` when no candidate came out:
    ``invalid_request`` (nothing to build), ``invalid_spec``, ``sandbox_unavailable``,
    ``selftest_failed``, or the repair step's code.
    """
    source = Path(source)
    if (source / SPEC_FILE).is_file():
        try:
            spec = json.loads((source / SPEC_FILE).read_text(encoding="utf-8"))
        except ValueError as exc:
            raise YimiError("invalid_spec", f"{SPEC_FILE} is not valid JSON ({exc})") from None
        validate_spec(spec)
        _reuse_source(spec)
        build = WorkshopBuild.objects.create(spec=spec, max_attempts=_attempts(None))
    elif (source / "plugin.json").is_file():
        build = WorkshopBuild.objects.create(source=str(source.resolve()), max_attempts=1)
    else:
        raise YimiError("invalid_request", f"{source.name or source} holds neither {SPEC_FILE} (a build spec) nor plugin.json (a pack draft)")
    progress(f"build {build.id}")
    build = execute_build(build.id, progress=progress, publish=False)
    if build.state != WorkshopBuild.State.SUCCEEDED:
        raise YimiError(build.error_code or "build_failed", build.error_message or "the build failed")
    return PackCandidate.objects.get(digest=build.candidate_digest)


# --- running ---------------------------------------------------------------------------------------


def _reuse_source(spec: dict[str, Any]) -> Path | None:
    """The local source of the index entry a reuse build names (None: nothing to copy);
    ``reuse_not_found`` when the index has no such entry."""
    reuse = spec.get("reuse")
    if not reuse:
        return None
    entry = find_entry(reuse["source"], reuse["id"])
    if entry is None:
        raise YimiError("reuse_not_found", f"the {reuse['source']} index has no entry {reuse['id']!r}")
    return entry.source_dir


def _update(build: WorkshopBuild, **fields: Any) -> None:
    for key, value in fields.items():
        setattr(build, key, value)
    WorkshopBuild.objects.filter(id=build.id).update(**fields, updated_at=timezone.now())


def _finish(build: WorkshopBuild, state: str, *, code: str = "", message: str = "", **fields: Any) -> WorkshopBuild:
    _update(build, state=state, error_code=code, error_message=message[:2000], finished_at=timezone.now(), **fields)
    log_event("workshop_build_finished", build_id=str(build.id), state=state, error_code=code, attempts=build.attempts)
    return build


def _make(build: WorkshopBuild, spec: dict[str, Any], workdir: Path) -> Path:
    """The build step: the pack directory for this attempt."""
    if build.source:
        draft = Path(build.source)
        pack = workdir / draft.name
        shutil.copytree(draft, pack, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        return pack
    return fill_template(spec, workdir, upstream=_reuse_source(spec))


def _self_test(pack: Path) -> tuple[bool, str]:
    """The static checks, then scripts/test.py in the sandbox: (passed, what to show)."""
    report = check_pack(pack, origin="workshop")
    not_granted = [f for f in report.findings if f.code == NOT_GRANTED]
    if not_granted:  # no repair can grant a secret: the build stops with the registry's code
        raise YimiError(NOT_GRANTED, not_granted[0].message)
    if not report.passed:
        return False, "static checks refused the pack:\n" + "\n".join(f"{f.code} {f.path}: {f.message}" for f in report.findings)
    result = run_sandboxed(
        [str(pack / "scripts" / "test.py")], readable=[pack], timeout=settings.YIMI_WORKSHOP_SELFTEST_TIMEOUT_SECONDS
    )
    output = (result.stdout + ("\n" + result.stderr if result.stderr.strip() else "")).strip()
    return result.ok, f"self-test {result.describe()}\n{output}"


def execute_build(
    build_id: Any, *, repair: Repair = model_repair, progress: Callable[[str], None] = _quiet, publish: bool = True
) -> WorkshopBuild:
    """Run a queued build to its end (see the module docstring); the build as it ended.

    Claims the row first (``queued`` → ``building``); a build someone else claimed is
    returned as it is, untouched. ``publish``: a passed candidate goes online (step 5);
    False stops at the candidate (the operator's ``pack build``).
    """
    claimed = WorkshopBuild.objects.filter(id=build_id, state=WorkshopBuild.State.QUEUED).update(
        state=WorkshopBuild.State.BUILDING, updated_at=timezone.now()
    )
    build = WorkshopBuild.objects.get(id=build_id)
    if claimed != 1:
        return build
    try:
        return _attempts_loop(build, repair, progress, publish)
    except Exception as exc:
        _finish(build, WorkshopBuild.State.FAILED, code="internal_error", message=f"the build stopped: {type(exc).__name__}")
        raise


def _pack_name(build: WorkshopBuild) -> str:
    """The name the build's pack will have ("" for a draft whose manifest cannot be read:
    its static checks will say why)."""
    if not build.source:
        return str(build.spec["name"])
    try:
        manifest = json.loads((Path(build.source) / "plugin.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    return str(manifest.get("name", "")) if isinstance(manifest, dict) else ""


def _attempts_loop(build: WorkshopBuild, repair: Repair, progress: Callable[[str], None], publish: bool) -> WorkshopBuild:
    spec = dict(build.spec)
    root = Path(settings.YIMI_WORKSHOP_DIR) / "builds" / str(build.id)
    built_against = registry.online_digest(_pack_name(build))  # the version online when the build started
    for attempt in range(1, build.max_attempts + 1):
        _update(build, attempts=attempt, state=WorkshopBuild.State.BUILDING)
        progress(f"attempt {attempt}/{build.max_attempts}: building")
        workdir = root / f"attempt-{attempt}"
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            pack = _make(build, spec, workdir)
            _update(build, state=WorkshopBuild.State.TESTING)
            progress(f"attempt {attempt}: self-test in the sandbox")
            passed, log = _self_test(pack)
        except YimiError as exc:
            return _finish(build, WorkshopBuild.State.FAILED, code=exc.code, message=exc.message)
        _update(build, log_tail=log[-LOG_TAIL_CHARS:])
        if passed:
            progress(f"attempt {attempt}: self-test passed; handing the pack to the registry")
            candidate = registry.add_candidate(pack, origin="workshop", built_against=built_against, progress=progress)
            _update(build, candidate_digest=candidate.digest, candidate_state=candidate.state)
            if not publish:
                return _finish(build, WorkshopBuild.State.SUCCEEDED)
            return _publish(build, candidate, progress)
        progress(f"attempt {attempt}: self-test failed")
        if attempt == build.max_attempts or build.source:
            break
        progress(f"attempt {attempt}: back to the build step (repair)")
        try:
            spec = repair(spec, log[-LOG_TAIL_CHARS:])
        except YimiError as exc:
            return _finish(build, WorkshopBuild.State.FAILED, code=exc.code, message=exc.message)
        _update(build, spec=spec)
    return _finish(
        build, WorkshopBuild.State.FAILED, code="selftest_failed",
        message=f"the self-test failed in each of {build.attempts} attempt(s); the last output is in the build's log",
    )


# --- publishing -----------------------------------------------------------------------------------


def _publish(build: WorkshopBuild, candidate: PackCandidate, progress: Callable[[str], None]) -> WorkshopBuild:
    """Step 5: a passed candidate goes online; the build ends with the registry's word."""
    if candidate.state != PackCandidate.State.PASSED:
        codes = sorted({f["code"] for f in candidate.static_report} | {f["code"] for f in (candidate.honesty_report or {}).get("findings", [])})
        return _finish(
            build, WorkshopBuild.State.FAILED, code="candidate_refused",
            message=f"the registry refused the candidate ({', '.join(codes) or 'see its check results'}); nothing was published",
        )
    progress(f"publishing {candidate.name} {candidate.version} ({candidate.digest[:12]})")
    try:
        version = registry.publish(candidate.digest, progress=progress)
    except YimiError as exc:
        if exc.code != "already_online":
            return _finish(build, WorkshopBuild.State.FAILED, code=exc.code, message=f"not published: {exc.message}")
        progress("this very version is already online")
    else:
        log_event("workshop_build_published", build_id=str(build.id), pack=version.pack.name, digest=version.digest[:12])
    return _finish(build, WorkshopBuild.State.SUCCEEDED)


def published_version(build: WorkshopBuild) -> dict[str, Any] | None:
    """The registry's word on the version a build made: ``{name, version, digest, state,
    online}`` (``state`` active, superseded or reverted; ``online``: it is the version
    online now), or None when it was never published."""
    if not build.candidate_digest:
        return None
    version = (
        PackVersion.objects.select_related("pack").filter(digest=build.candidate_digest, origin=PackVersion.Origin.PUBLISHED)
        .order_by("-activated_at").first()
    )
    if version is None:
        return None
    online = registry.online_digest(version.pack.name) == version.digest
    return {"name": version.pack.name, "version": version.version, "digest": version.digest, "state": version.state, "online": online}
