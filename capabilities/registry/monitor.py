"""Monitoring Yimi-built packs in the maintenance cycle (F4; docs/decisions/2026-12-03-pack-monitoring.md).

``monitor_cycle()`` runs from Celery beat (``capabilities.tasks.monitor_packs``). For every
pack whose online version Yimi built (maintainer ``yimi`` or made by the workshop):

1. health check: the registry's copy is intact, the loader serves that version, and its
   host starts in the sandbox serving the declared tools (``publish.preload``). A failed
   health check reverts the version at once;
2. the "failed + unknown" rate of the online version against its previous version, from
   the receipt ledger: each call the gateway let through carries the digest of the pack
   version it was decided on (``ToolCall.pack_version``); its result is its latest receipt
   revision a pack wrote. Finished results are ``succeeded``, ``partial``, ``failed``,
   ``unknown``, ``cancelled``; bad ones ``failed`` and ``unknown``;
3. the Wilson score interval at 95 % (z = 1.96) of each rate; with at least 20 finished
   results on each side, revert iff the new version's lower bound exceeds the old one's
   upper bound (``decide``). Fewer results: no decision, wait for more.

The figures are stored on the online version (``PackVersion.monitoring``) for the admin.
The cycle also records shipped versions, grants the shipped packs their listed secrets
(``grants.grant_shipped_secrets``) and rewrites the selection and grants files from the
database.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, OuterRef, Subquery
from django.utils import timezone

from capabilities.manifest import load_packs
from capabilities.models import ReceiptRecord, ToolCall
from capabilities.registry.candidates import verify_stored
from capabilities.registry.grants import grant_shipped_secrets
from capabilities.registry.publish import PreloadError, preload, record_shipped_versions, revert, write_selection
from capabilities.registry_models import PackCandidate, PackVersion, RegisteredPack
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

Z = 1.96
MIN_FINISHED = 20
FINISHED = ("succeeded", "partial", "failed", "unknown", "cancelled")
BAD = ("failed", "unknown")


@dataclass(frozen=True)
class Figures:
    finished: int
    bad: int

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.bad, self.finished)

    def as_json(self) -> dict[str, Any]:
        low, high = self.interval
        return {**asdict(self), "low": round(low, 4), "high": round(high, 4)}


@dataclass(frozen=True)
class Decision:
    revert: bool | None  # None: not enough finished results to decide
    reason: str


def wilson(bad: int, n: int, z: float = Z) -> tuple[float, float]:
    """The Wilson score interval of the rate ``bad / n``: (lower, upper); (0, 1) for n = 0."""
    if n <= 0:
        return (0.0, 1.0)
    p = bad / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    denominator = 1 + z * z / n
    return ((centre - spread) / denominator, (centre + spread) / denominator)


def decide(new: Figures, old: Figures) -> Decision:
    """Revert iff both sides have ≥20 finished results and new lower bound > old upper bound."""
    if new.finished < MIN_FINISHED or old.finished < MIN_FINISHED:
        return Decision(None, f"not enough finished results yet (new {new.finished}, old {old.finished}; {MIN_FINISHED} each)")
    new_low, _ = new.interval
    _, old_high = old.interval
    if new_low > old_high:
        return Decision(True, f"failed+unknown rose: new lower bound {new_low:.3f} > old upper bound {old_high:.3f}")
    return Decision(False, f"no clear regression: new lower bound {new_low:.3f} ≤ old upper bound {old_high:.3f}")


def version_figures(digest: str) -> Figures:
    """Finished and bad results of the calls decided on this pack version (the ledger)."""
    latest = ReceiptRecord.objects.filter(call=OuterRef("pk"), written_by_gateway=False).order_by("-revision").values("status")[:1]
    rows = (
        ToolCall.objects.filter(pack_version=digest, decision__in=(ToolCall.Decision.ALLOW, ToolCall.Decision.REWRITE))
        .annotate(result=Subquery(latest))
        .values("result")
        .annotate(n=Count("id"))
    )
    counts = {row["result"]: row["n"] for row in rows}
    return Figures(sum(counts.get(s, 0) for s in FINISHED), sum(counts.get(s, 0) for s in BAD))


def health_problem(version: PackVersion) -> str | None:
    """Why the online version is unhealthy, or None."""
    candidate = version.candidate
    if candidate is None or not verify_stored(candidate):
        return "the registry's copy of this version is missing or changed"
    packs = load_packs()
    name = version.pack.name
    if name in packs.refused:
        return "the pack loader refuses it"
    loaded = packs.packs.get(name)
    if loaded is None:
        return None if name in packs.disabled else "the pack loader does not serve it"
    if loaded.digest != version.digest:
        return "the pack loader serves another version"
    try:
        preload(loaded.path)
    except PreloadError as exc:
        return f"its host does not start: {str(exc)[:200]}"
    return None


def yimi_built(version: PackVersion) -> bool:
    origin = version.candidate.origin if version.candidate is not None else ""
    return version.maintainer == "yimi" or origin == PackCandidate.Origin.WORKSHOP


def monitor_cycle(*, now: datetime | None = None) -> list[dict[str, Any]]:
    """One maintenance cycle over the Yimi-built packs online; returns what it did per pack."""
    now = now or timezone.now()
    record_shipped_versions()
    grant_shipped_secrets(by="maintenance")  # a shipped pack's new secret; a lost grants file comes back
    write_selection()
    results = []
    for entry in RegisteredPack.objects.select_related("active__candidate", "active__previous").filter(active__isnull=False):
        version = entry.active
        if version is None or not yimi_built(version):
            continue
        results.append(_watch(entry.name, version, now))
    return results


def _watch(name: str, version: PackVersion, now: datetime) -> dict[str, Any]:
    problem = health_problem(version)
    record: dict[str, Any] = {"pack": name, "digest": version.digest, "checked_at": now.isoformat(), "health": problem or "ok"}
    new = version_figures(version.digest)
    record["new"] = new.as_json()
    action = "stay"
    if problem is not None:
        action, record["reason"] = "revert", f"health check failed: {problem}"
    elif version.previous is not None:
        old = version_figures(version.previous.digest)
        decision = decide(new, old)
        record["old"], record["reason"] = old.as_json(), decision.reason
        action = "revert" if decision.revert else "stay" if decision.revert is False else "wait"
    else:
        record["reason"] = "a first version: nothing to compare with"
    record["action"] = action
    PackVersion.objects.filter(pk=version.pk).update(monitoring=record)
    if action == "revert":
        try:
            revert(name, reason=f"monitoring: {record['reason']}"[:300], expected_digest=version.digest)
        except YimiError as exc:
            record["action"] = f"revert not done ({exc.code})"
    log_event("pack_monitored", pack=name, digest=version.digest[:12], action=record["action"], health=record["health"])
    return record
