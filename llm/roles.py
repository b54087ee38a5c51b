"""Model roles: the one authority over which endpoint, model and key each role uses.

The only code that writes ``ModelRole``, ``ModelRoleRevision`` and ``ModelSettingsImport``, but
for backups: ``llm.role_backup`` restores a backup (each role through ``apply``, then it deletes
the roles the backup lacks and records the environment import as done) and re-wraps every
sealed key of the roles and their revisions when the master key is rotated.

- ``resolve(role)``: the role's current settings, with the provider key decrypted. Roles
  without a row fall back (``delegation``, ``executor_fast``, ``executor_thorough`` and
  ``workshop_repair`` use ``brain``); the others are ``role_not_configured``.
- ``apply(...)``: one change, in one transaction under ``select_for_update``: version + 1,
  a revision row kept. Drafts confirmed on a device and the console call it.
- ``import_from_environment()``: the first start imports the brain, vision and workshop
  settings and keys from the deployment environment, once; the marker row
  (``ModelSettingsImport``) makes every later start keep the stored settings.
- ``for_run(run_id)``: the settings a run's tree uses, pinned on the run when it starts
  (``Run.model_roles``): a change applied while a run works takes effect for the next run.
  The pin is a column of brain's ``Run`` (a layer above): brain registers how it is read
  and written (``register_run_pins``, from ``BrainConfig.ready``); this module never
  imports brain.
"""

from __future__ import annotations

import math
import operator
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import reduce
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from llm import keyring
from llm.models import ROLE_NAMES, ModelRole, ModelRoleRevision, ModelSettingsImport, RoleSource
from llm.queries import role_rows_sql
from yimi_project.errors import YimiError
from yimi_project.infra import statements
from yimi_project.logs import log_event
from yimi_project.secrets import read_secret

ROLES = ROLE_NAMES
FALLBACK = {"delegation": "brain", "executor_fast": "brain", "executor_thorough": "brain", "workshop_repair": "brain"}
SOURCES = tuple(RoleSource.values)
DEFAULT_OPTIONS: dict[str, Any] = {
    "thinking_field": "",
    "timeout_seconds": 60.0,
    "connect_timeout_seconds": 5.0,
    "max_tokens": None,
    "include_usage": True,  # ask for the stream's usage event (stream_options.include_usage)
    "estimate_usage": False,  # count tokens locally when the provider reports none (llm.usage)
}
MAX_TIMEOUT_SECONDS = 600.0
MAX_TOKENS_LIMIT = 1_000_000
FIELD_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")
ENVIRONMENT_NOTE = "imported from the environment at first start"
DEMO_NOTE = "demo brain"
DEMO_PROVIDER = "demo"  # the provider name the first start gives the demo brain (``manage.py fake_brain``)


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


KEEP: Any = _Keep()  # ``apply(api_key=KEEP)``: the stored key stays as it is


@dataclass(frozen=True)
class RoleSettings:
    """One role's settings as a call uses them. ``role`` is the role asked for,
    ``configured_as`` the row that answered (``brain`` for a fallback)."""

    role: str
    provider: str
    base_url: str
    model: str
    api_key: str | None = field(repr=False)
    thinking_field: str
    timeout_seconds: float
    connect_timeout_seconds: float
    max_tokens: int | None
    version: int
    source: str
    configured_as: str = ""
    include_usage: bool = True
    estimate_usage: bool = False


@dataclass(frozen=True)
class RunRoles:
    """The roles one run's tree uses: ``brain`` (main turn, reports) and ``delegation``
    (sub-agents)."""

    brain: RoleSettings
    delegation: RoleSettings


RUN_ROLES = ("brain", "delegation")


def key_aad(role: str) -> str:
    """What a role's sealed key is bound to: a blob copied to another role does not open."""
    return f"yimi-model-role:{role}"


def settings_lock() -> None:
    """The one lock every change of model settings takes (inside its transaction): the
    marker row, locked ``FOR UPDATE``, so ``apply`` and the master-key rotation never
    interleave. Before the first-start import there is no row and nothing to serialize."""
    ModelSettingsImport.objects.select_for_update().filter(id=1).first()


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise YimiError("unknown_role", f"there is no model role {role[:40]!r}; roles: {', '.join(ROLES)}")


def validate_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The options with defaults filled in; anything out of range is ``invalid_model_settings``."""
    raw = dict(options or {})
    unknown = set(raw) - set(DEFAULT_OPTIONS)
    if unknown:
        raise YimiError("invalid_model_settings", f"unknown option(s): {', '.join(sorted(unknown))}")
    out = {**DEFAULT_OPTIONS, **{k: v for k, v in raw.items() if v is not None}}
    thinking = out["thinking_field"]
    if not isinstance(thinking, str) or (thinking and not FIELD_NAME.match(thinking)):
        raise YimiError("invalid_model_settings", "thinking_field must be a request field name (e.g. enable_thinking) or empty")
    for name in ("timeout_seconds", "connect_timeout_seconds"):
        try:
            value = float(out[name])
        except (TypeError, ValueError):
            value = math.nan
        if not 0 < value <= MAX_TIMEOUT_SECONDS:
            raise YimiError("invalid_model_settings", f"{name} must be a number of seconds above 0 and at most {MAX_TIMEOUT_SECONDS:g}")
        out[name] = value
    for name in ("include_usage", "estimate_usage"):
        if not isinstance(out[name], bool):
            raise YimiError("invalid_model_settings", f"{name} must be true or false")
    if out["max_tokens"] is not None:
        tokens = out["max_tokens"]
        if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_TOKENS_LIMIT:
            raise YimiError("invalid_model_settings", f"max_tokens must be an integer from 1 to {MAX_TOKENS_LIMIT}, or empty")
    return out


def _validate_endpoint(provider: str, base_url: str, model: str) -> None:
    if not provider.strip() or len(provider) > 64:
        raise YimiError("invalid_model_settings", "provider must be a name of 1 to 64 characters")
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname or len(base_url) > 500:
        raise YimiError("invalid_model_settings", "base_url must be an http:// or https:// URL (the OpenAI-compatible /v1 root)")
    if parts.username or parts.password:
        raise YimiError("invalid_model_settings", "base_url must not carry credentials; the key is stored on its own")
    if not model.strip() or len(model) > 200:
        raise YimiError("invalid_model_settings", "model must be a name of 1 to 200 characters")


# --- reading -------------------------------------------------------------------------------------


def _settings_of(row: ModelRole | ModelRoleRevision, asked: str) -> RoleSettings:
    options = {**DEFAULT_OPTIONS, **(row.options or {})}
    key = keyring.decrypt(row.api_key_encrypted, key_aad(row.role)) if row.api_key_encrypted else None
    return RoleSettings(
        role=asked,
        provider=row.provider,
        base_url=row.base_url,
        model=row.model,
        api_key=key,
        thinking_field=str(options["thinking_field"] or ""),
        timeout_seconds=float(options["timeout_seconds"]),
        connect_timeout_seconds=float(options["connect_timeout_seconds"]),
        max_tokens=options["max_tokens"],
        version=row.version,
        source=row.source,
        configured_as=row.role,
        include_usage=bool(options["include_usage"]),
        estimate_usage=bool(options["estimate_usage"]),
    )


def configured_rows(wanted: tuple[str, ...]) -> dict[str, ModelRole]:
    """The row that answers for each role of ``wanted`` (its own, or its fallback's), read in
    one query. Once this process has seen the first-start import done it does not ask
    again (``ensure_imported``); a role found missing asks once more, in case the marker is
    gone (a database restored or emptied) and the import is due again."""
    for role in wanted:
        _check_role(role)
    for attempt in (1, 2):
        ensure_imported()
        names = {name for role in wanted for name in (role, FALLBACK.get(role, role))}
        rows = {r.role: r for r in _role_rows(sorted(names))}
        found = {role: rows.get(role) or rows.get(FALLBACK.get(role, "")) for role in wanted}
        missing = [role for role, row in found.items() if row is None]
        if not missing:
            return found  # type: ignore[return-value]  # no None left
        if attempt == 1 and _imported_seen:
            _forget_import()
            continue
        raise YimiError("role_not_configured", f"the model role {missing[0]!r} is not configured")
    raise AssertionError("unreachable")


def _role_rows(names: list[str]) -> list[ModelRole]:
    """The rows of ``names`` (read on every run start: on PostgreSQL the SELECT is built once
    per process and number of names, ``llm.queries.role_rows_sql``; elsewhere the ORM)."""
    if not statements.on_postgresql():
        return list(ModelRole.objects.filter(role__in=names))
    sql, fields = role_rows_sql(len(names))
    return statements.fetch_instances(ModelRole, sql, names, fields)


def stored(role: str) -> RoleSettings | None:
    """``role``'s own stored settings (no fallback), key decrypted, or None when it has no
    row. Unlike ``resolve`` it never runs the first-start import: for checks that only read
    (the brain probe, ``yimi_init``'s comparison with the environment)."""
    _check_role(role)
    row = ModelRole.objects.filter(role=role).first()
    return None if row is None else _settings_of(row, role)


def configured_row(role: str) -> ModelRole:
    """The row that answers for ``role`` (its own, or its fallback's)."""
    return configured_rows((role,))[role]


def resolve(role: str) -> RoleSettings:
    """``role``'s settings now, key decrypted (``model_master_key_missing``,
    ``model_key_undecryptable`` if it cannot be)."""
    return _settings_of(configured_row(role), role)


UNREAD: Any = object()  # ``for_run(pin=UNREAD)``: the caller has not read the run's pin

# How a run's pin (``Run.model_roles``, brain's table) is read, and written when it has none:
# registered by brain (``register_run_pins``).
_RUN_PINS: list[tuple[Callable[[Any], Any], Callable[[Any, dict[str, Any]], bool]]] = []


def register_run_pins(read: Callable[[Any], Any], write_unset: Callable[[Any, dict[str, Any]], bool]) -> None:
    """Called from the ``brain`` app's ``AppConfig.ready``: ``read(run_id)`` returns the run's
    pin (None if none); ``write_unset(run_id, pin)`` writes it only where the run has none
    (one conditional UPDATE) and says whether it did."""
    _RUN_PINS[:] = [(read, write_unset)]


def _run_pins() -> tuple[Callable[[Any], Any], Callable[[Any, dict[str, Any]], bool]]:
    if not _RUN_PINS:
        raise RuntimeError("no run pins are registered: the brain app registers them when Django starts")
    return _RUN_PINS[0]


def pin_of(rows: dict[str, ModelRole]) -> dict[str, Any]:
    """The pin (``Run.model_roles``) of the rows ``configured_rows`` read: per role, the row
    that answers for it and that row's version."""
    return {role: {"configured_as": row.role, "version": row.version} for role, row in rows.items()}


def of_rows(rows: dict[str, ModelRole]) -> RunRoles:
    """The run's settings from the rows it was pinned to just now (no second read)."""
    return RunRoles(**{role: _settings_of(row, role) for role, row in rows.items()})


def for_run(run_id: Any, *, pin: Any = UNREAD) -> RunRoles:
    """The settings of ``RUN_ROLES`` for one run's whole tree, the same from its first
    request to its last report. ``pin``: the run's ``model_roles`` when the caller has just
    read the run, which saves reading it again (the runner's claim writes the pin itself
    and comes here only for a run pinned before, ``brain.runner._claim_and_prepare``).

    Steps: 1. read the run's pin (``Run.model_roles``); 2. none yet (the run is starting):
    resolve both roles now (one query, ``configured_rows``) and write the pin with a
    conditional UPDATE (``model_roles IS NULL``); a lost race reads the winner's pin
    instead; 3. load the pinned versions from ``ModelRoleRevision`` (one query). A pinned
    revision that no longer exists (settings restored from a backup) falls back to the
    current settings, logged. A starting run: 2 queries with ``pin``, 3 without; a pinned
    one: 1 and 2.
    """
    read_pin, write_pin = _run_pins()
    if pin is UNREAD:
        pin = read_pin(run_id)
    if not pin:
        rows = configured_rows(RUN_ROLES)
        wanted = pin_of(rows)
        if write_pin(run_id, wanted):
            return of_rows(rows)
        pin = read_pin(run_id) or wanted
    entries: dict[str, tuple[str, Any]] = {}
    for role in RUN_ROLES:
        entry: dict[str, Any] = pin.get(role) or {}
        entries[role] = (str(entry.get("configured_as", "")), entry.get("version"))
    pinned = [Q(role=name, version=version) for name, version in entries.values() if isinstance(version, int)]
    revisions: dict[tuple[str, int], ModelRoleRevision] = {}
    if pinned:
        revisions = {(r.role, r.version): r for r in ModelRoleRevision.objects.filter(reduce(operator.or_, pinned))}
    found: dict[str, RoleSettings] = {}
    for role, key in entries.items():
        revision = revisions.get(key) if isinstance(key[1], int) else None
        if revision is None:
            log_event("run_model_pin_missing", run_id=str(run_id), role=role)
            found[role] = resolve(role)
        else:
            found[role] = _settings_of(revision, role)
    return RunRoles(**found)


# --- writing -------------------------------------------------------------------------------------


def apply(
    role: str,
    *,
    provider: str,
    base_url: str,
    model: str,
    options: Mapping[str, Any] | None,
    api_key: Any = KEEP,
    source: str,
    note: str = "",
) -> ModelRole:
    """Make these the role's settings, as one new version.

    Steps: 1. validate everything (bad input changes nothing); 2. in one transaction,
    take ``settings_lock`` and lock the role's row (``select_for_update``; a first row is created, and a concurrent
    creator's unique violation means the row exists: it is locked instead); 3. seal the
    key (``KEEP``: the stored one stays; None or "": no key); 4. write the row with
    version + 1 and its revision. Runs already working keep the version they pinned.
    """
    _check_role(role)
    if source not in SOURCES:
        raise YimiError("invalid_model_settings", f"source must be one of {', '.join(SOURCES)}")
    _validate_endpoint(provider, base_url, model)
    clean = validate_options(options)
    if api_key is not KEEP and api_key is not None and not isinstance(api_key, str):
        raise YimiError("invalid_model_settings", "api_key must be text")
    with transaction.atomic():
        settings_lock()  # before sealing: a rotation in progress finishes first, then the new key seals
        sealed = keyring.encrypt(api_key, key_aad(role)) if isinstance(api_key, str) and api_key else None
        row = ModelRole.objects.select_for_update().filter(role=role).first()
        if row is None:
            try:
                with transaction.atomic():
                    row = ModelRole.objects.create(
                        role=role, provider=provider, base_url=base_url, model=model, options=clean,
                        api_key_encrypted=sealed if api_key is not KEEP else None, source=source,
                        source_note=note[:200], version=_next_revision(role),
                    )
            except IntegrityError:
                row = ModelRole.objects.select_for_update().get(role=role)
            else:
                _record_revision(row)
                log_event("model_role_applied", role=role, version=row.version, source=source)
                return row
        row.provider, row.base_url, row.model, row.options = provider, base_url, model, clean
        if api_key is not KEEP:
            row.api_key_encrypted = sealed
        row.source, row.source_note = source, note[:200]
        row.version = max(row.version, _next_revision(role) - 1) + 1
        row.save()
        _record_revision(row)
    log_event("model_role_applied", role=role, version=row.version, source=source)
    return row


def _next_revision(role: str) -> int:
    last = ModelRoleRevision.objects.filter(role=role).order_by("-version").values_list("version", flat=True).first()
    return (last or 0) + 1


def _record_revision(row: ModelRole) -> None:
    ModelRoleRevision.objects.create(
        role=row.role, provider=row.provider, base_url=row.base_url, model=row.model, options=row.options,
        api_key_encrypted=row.api_key_encrypted, source=row.source, source_note=row.source_note, version=row.version,
    )


# --- the first start ---------------------------------------------------------------------------


def import_marker() -> ModelSettingsImport | None:
    return ModelSettingsImport.objects.filter(id=1).first()


# Whether this process has seen the first-start import done: the marker row is never
# removed by the platform, so once seen it is not asked for again (a query saved per read of
# the settings; ``configured_rows`` asks again if a role turns out missing).
_imported_seen = False


def _forget_import() -> None:
    global _imported_seen
    _imported_seen = False


def ensure_imported() -> None:
    """Run the first-start import if no process has yet (no query once this process has
    seen it done)."""
    global _imported_seen
    if _imported_seen:
        return
    if not ModelSettingsImport.objects.filter(id=1).exists():
        import_from_environment()  # done by now: by this call, or by a concurrent first start
    _imported_seen = True


def import_from_environment(environ: Mapping[str, str] | None = None, *, now: datetime | None = None) -> list[str] | None:
    """First start only: import brain (``YIMI_BRAIN_*``), vision (``YIMI_VISION_*``) and
    workshop (``YIMI_WORKSHOP_*``) settings and keys, and record that it happened.
    Returns the roles imported, or None when an earlier start already did it.

    Steps: 1. in one transaction, insert the marker row (``id=1``); a concurrent first
    start blocks on it and, once the winner commits, gets a unique violation: it returns
    None; 2. read the variables and key files and ``apply`` each configured role (source
    ``environment``); without ``YIMI_BRAIN_BASE_URL`` the brain role is the demo brain
    (``manage.py fake_brain``). Any error rolls everything back, marker included, and the
    next start tries again.
    """
    env = os.environ if environ is None else environ
    secrets_dir = Path(settings.SECRETS_DIR)
    with transaction.atomic():
        if ModelSettingsImport.objects.filter(id=1).exists():
            return None
        try:
            with transaction.atomic():
                marker = ModelSettingsImport.objects.create(id=1, imported_at=now or timezone.now(), roles=[])
        except IntegrityError:
            return None
        imported = []
        for role, prefix, key_file in (("brain", "YIMI_BRAIN", "brain_api_key"), ("vision", "YIMI_VISION", "vision_api_key"),
                                       ("workshop_repair", "YIMI_WORKSHOP", "workshop_api_key")):
            found = _from_environment(role, prefix, env, read_secret(secrets_dir, key_file))
            if found is not None:
                apply(role, source=RoleSource.ENVIRONMENT, **found)
                imported.append(role)
        marker.roles = imported
        marker.save(update_fields=["roles"])
    log_event("model_settings_imported", roles=imported)
    return imported


def _from_environment(role: str, prefix: str, env: Mapping[str, str], key_from_file: str) -> dict[str, Any] | None:
    base_url = env.get(f"{prefix}_BASE_URL", "").strip()
    model = env.get(f"{prefix}_MODEL", "").strip()
    key = key_from_file or env.get(f"{prefix}_API_KEY", "").strip() or None
    options: dict[str, Any] = {}
    for option, variable, kind in (
        ("thinking_field", "THINKING_FIELD", str), ("timeout_seconds", "TIMEOUT_SECONDS", float),
        ("connect_timeout_seconds", "CONNECT_TIMEOUT_SECONDS", float), ("max_tokens", "MAX_TOKENS", int),
    ):
        raw = env.get(f"{prefix}_{variable}", "").strip()
        if raw:
            try:
                options[option] = kind(raw)
            except ValueError:
                raise YimiError("invalid_model_settings", f"{prefix}_{variable} is not a valid {kind.__name__}: {raw[:40]!r}") from None
    if role == "brain" and not base_url:
        port = settings.FAKE_BRAIN_PORT
        return {"provider": DEMO_PROVIDER, "base_url": f"http://127.0.0.1:{port}/v1", "model": model or "yimi-demo",
                "options": options, "api_key": None, "note": DEMO_NOTE}
    if not base_url:
        return None
    if not model:
        raise YimiError("invalid_model_settings", f"{prefix}_BASE_URL is set but {prefix}_MODEL is not")
    provider = env.get(f"{prefix}_PROVIDER", "").strip() or (urlsplit(base_url).hostname or "provider")
    return {"provider": provider, "base_url": base_url, "model": model, "options": options, "api_key": key, "note": ENVIRONMENT_NOTE}


def demo_brain_port(provider: str, base_url: str) -> int | None:
    """The port of the demo brain (``manage.py fake_brain``) these settings point at, or None:
    provider ``demo`` and a plain-http loopback URL, as the first start stores it."""
    parts = urlsplit(base_url)
    if provider != DEMO_PROVIDER or parts.scheme != "http" or parts.hostname not in ("127.0.0.1", "localhost"):
        return None
    try:
        return parts.port or 80
    except ValueError:
        return None


def demo_brain_ports() -> list[int]:
    """The ports of the demo brain any stored role points at (brain, vision, ...): what
    ``./yimi up`` starts, decided by the stored settings, never by the environment."""
    found = {demo_brain_port(provider, url) for provider, url in ModelRole.objects.values_list("provider", "base_url")}
    return sorted(port for port in found if port is not None)


def environment_brain(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The brain the environment names (``YIMI_BRAIN_BASE_URL``, ``YIMI_BRAIN_MODEL``,
    ``YIMI_BRAIN_PROVIDER``), read as the first start reads it but without the key; None
    when ``YIMI_BRAIN_BASE_URL`` is unset. ``invalid_model_settings`` when it is unusable."""
    env = os.environ if environ is None else environ
    if not env.get("YIMI_BRAIN_BASE_URL", "").strip():
        return None
    found = _from_environment("brain", "YIMI_BRAIN", env, "")
    assert found is not None  # a base URL is set
    found.pop("api_key", None)
    return found


# --- for the console ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RoleRow:
    """One role as the console lists it: never the key, only whether there is one."""

    role: str
    configured: bool
    provider: str
    model: str
    base_url: str
    source: str
    source_text: str
    key_state: str
    version: int | None
    updated_at: datetime | None


def overview() -> list[RoleRow]:
    marker = import_marker()
    rows = {r.role: r for r in ModelRole.objects.all()}
    out = []
    for role in ROLES:
        row = rows.get(role)
        if row is None:
            fallback = FALLBACK.get(role)
            text = f"not configured: uses {fallback}" if fallback and fallback in rows else "not configured"
            out.append(RoleRow(role, False, "", "", "", "", text, "—", None, None))
            continue
        out.append(RoleRow(role, True, row.provider, row.model, row.base_url, row.source, source_text(row, marker),
                           "set" if row.api_key_encrypted else "not set", row.version, row.updated_at))
    return out


def source_text(row: ModelRole, marker: ModelSettingsImport | None) -> str:
    if row.source == RoleSource.ENVIRONMENT:
        when = f" on {marker.imported_at:%Y-%m-%d}" if marker is not None else ""
        demo = f" ({DEMO_NOTE})" if row.source_note == DEMO_NOTE else ""
        return f"imported from the environment at first start{when}{demo}"
    if row.source == RoleSource.CONSOLE:
        return f"set in the console on {row.updated_at:%Y-%m-%d}"
    if row.source == RoleSource.DRAFT:
        return f"a draft confirmed on a device on {row.updated_at:%Y-%m-%d}" + (f" ({row.source_note})" if row.source_note else "")
    return f"restored from a backup on {row.updated_at:%Y-%m-%d}" + (f" ({row.source_note})" if row.source_note else "")
