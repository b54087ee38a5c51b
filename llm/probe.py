"""Is the brain answering? One cheap probe of the stored ``brain`` role, for ``GET
/api/health/`` and the owner's home page alike.

- ``brain_status()`` (sync) and ``brain_status_async()`` (for async views: the database on
  Django's thread, the request on a worker thread, never on the event loop) return a
  ``BrainStatus``.
- The probe is ``GET {base_url}/models`` with the role's provider key as a Bearer token (only
  to the URL that key is stored for) and ``PROBE_TIMEOUT_SECONDS`` to connect and to answer.
  An endpoint without ``/models`` (404, 405) still answers.
- Its result is kept ``CACHE_SECONDS`` per process, and one probe runs at a time per process
  (callers arriving meanwhile wait for it and share its result): a load of health checks
  never becomes a load on the brain. A changed role (another version) is probed afresh.

Reasons (``BrainStatus.reason``, stable codes; empty when answering):
``brain_not_configured`` (no stored brain role yet: the health check does not count it as a failure), ``brain_key_unreadable`` (the provider
key cannot be decrypted: ``model_master_key_missing`` and the like, in ``detail``),
``brain_unreachable`` (no connection), ``brain_timeout``, ``brain_unauthorized`` (HTTP 401
or 403: the key is refused), ``brain_error`` (any other answer but 2xx, 404, 405).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import httpx
from asgiref.sync import sync_to_async

from llm import roles
from yimi_project.errors import YimiError
from yimi_project.views import HealthCheck

PROBE_TIMEOUT_SECONDS = 2.0
CACHE_SECONDS = 5.0
ANSWERING_STATUSES = (404, 405)  # besides 2xx: the server is there, it only has no /models


@dataclass(frozen=True)
class Target:
    """What is probed: the stored brain role's endpoint (``key`` identifies its version)."""

    base_url: str
    model: str
    api_key: str | None = field(repr=False)
    demo: bool
    key: tuple[str, int, str, str]


@dataclass(frozen=True)
class BrainStatus:
    answering: bool
    reason: str  # "" when answering; else one of the codes above
    detail: str  # for the owner and loopback callers only: the URL and what happened
    base_url: str = ""
    model: str = ""
    demo: bool = False  # the role points at the demo brain (manage.py fake_brain)
    http_status: int | None = None


_lock = threading.Lock()  # one probe at a time in this process
_cached: tuple[tuple[str, int, str, str], float, BrainStatus] | None = None


def read_target() -> Target | BrainStatus:
    """The stored brain role as a probe target (one query), or the status that says why there
    is none. Never runs the first-start import."""
    try:
        found = roles.stored("brain")
    except YimiError as exc:
        return BrainStatus(False, "brain_key_unreadable", f"the brain role's provider key cannot be read: {exc.message} ({exc.code})")
    if found is None:
        return BrainStatus(False, "brain_not_configured", "there is no brain role yet: manage.py yimi_init imports it at the first start")
    demo = roles.demo_brain_port(found.provider, found.base_url) is not None
    return Target(found.base_url, found.model, found.api_key, demo, (found.configured_as, found.version, found.base_url, found.model))


def probe(target: Target, *, timeout: float = PROBE_TIMEOUT_SECONDS) -> BrainStatus:
    """One ``GET {base_url}/models``, uncached."""
    url = target.base_url.rstrip("/") + "/models"
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}

    def said(answering: bool, reason: str, detail: str, http_status: int | None = None) -> BrainStatus:
        return BrainStatus(answering, reason, detail, target.base_url, target.model, target.demo, http_status)

    try:
        with httpx.Client(timeout=httpx.Timeout(timeout)) as client:
            status = client.get(url, headers=headers).status_code
    except httpx.TimeoutException:
        return said(False, "brain_timeout", f"{url} did not answer within {timeout:g} s")
    except httpx.TransportError as exc:
        return said(False, "brain_unreachable", f"cannot connect to {url} ({type(exc).__name__})")
    if 200 <= status < 300 or status in ANSWERING_STATUSES:
        return said(True, "", f"{url} answered HTTP {status}", status)
    if status in (401, 403):
        return said(False, "brain_unauthorized", f"{url} refused the provider key (HTTP {status})", status)
    return said(False, "brain_error", f"{url} answered HTTP {status}", status)


def cached_probe(target: Target, *, now: float | None = None) -> BrainStatus:
    """``probe(target)``, or its result from less than ``CACHE_SECONDS`` ago (``now``: a
    ``time.monotonic()`` reading, injected by tests)."""
    global _cached
    with _lock:
        at = time.monotonic() if now is None else now
        if _cached is not None and _cached[0] == target.key and 0 <= at - _cached[1] < CACHE_SECONDS:
            return _cached[2]
        status = probe(target)
        _cached = (target.key, at, status)
        return status


def brain_status(*, now: float | None = None) -> BrainStatus:
    """Whether the stored brain role answers (cached; see the module)."""
    target = read_target()
    return target if isinstance(target, BrainStatus) else cached_probe(target, now=now)


async def brain_status_async() -> BrainStatus:
    """``brain_status()`` for async code: the database read on Django's thread, the probe
    (and any wait for one under way) on a worker thread."""
    target = await sync_to_async(read_target)()
    if isinstance(target, BrainStatus):
        return target
    return await asyncio.to_thread(cached_probe, target)


async def health_check() -> HealthCheck:
    """``GET /api/health/``'s check (registered by llm's app config): degraded with the
    status's reason when the brain role does not answer."""
    status = await brain_status_async()
    if status.reason == "brain_not_configured":
        # Nothing stored yet (yimi_init imports it before `./yimi up` serves; a process started
        # without it imports at the first run): nothing to probe, not a failure of the brain.
        return HealthCheck(True, "", {"brain": "not imported yet", "brain_answering": {"answering": None, "reason": status.reason, "detail": status.detail}})
    return HealthCheck(status.answering, status.reason, {
        "brain": "demo" if status.demo else "configured",
        "brain_answering": {"answering": status.answering, "reason": status.reason, "detail": status.detail},
    })


def forget() -> None:
    """Drop the cached result (tests; nothing else needs it)."""
    global _cached
    with _lock:
        _cached = None
