"""Monitoring Yimi-built packs (issue 18, F4; docs/decisions/2026-12-03-pack-monitoring.md): the Wilson
95 % interval of the "failed + unknown" rate, at least 20 finished results on each side,
revert iff the new lower bound exceeds the old upper bound; a failed health check reverts
at once. The figures come from the receipt ledger, by the pack version each call was
decided on."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from brain.models import Run
from brain.services import accept_utterance
from capabilities.models import ReceiptRecord, ToolCall
from capabilities.registry import online_digest, publish
from capabilities.registry.monitor import Figures, decide, monitor_cycle, version_figures, wilson
from capabilities.registry_models import PackCandidate, PackVersion
from capabilities.services import CallRequest
from capabilities.services import decide as gateway_decide
from tests.conftest import new_client_id
from tests.support.registry_support import candidate, use_registry

pytestmark = pytest.mark.django_db


@pytest.fixture
def shipped(tmp_path: Path, settings: Any) -> Path:
    return use_registry(tmp_path, settings)


def test_the_wilson_interval_matches_a_worked_example() -> None:
    for (bad, n), (low, high) in {(2, 40): (0.014, 0.165), (6, 20): (0.145, 0.519), (12, 30): (0.246, 0.577)}.items():
        got = wilson(bad, n)
        assert (round(got[0], 3), round(got[1], 3)) == (low, high)
    old = Figures(40, 2)
    assert decide(Figures(20, 6), old).revert is False  # 0.145 ≤ 0.165: wait for more
    assert decide(Figures(30, 12), old).revert is True  # 0.246 > 0.165
    assert decide(Figures(19, 19), old).revert is None  # fewer than 20 on the new side
    assert decide(Figures(30, 12), Figures(19, 0)).revert is None  # fewer than 20 on the old side


def results(run: Run, digest: str, statuses: list[str]) -> None:
    """Calls decided on pack version ``digest``, each with the receipts a pack wrote."""
    for status in statuses:
        call = ToolCall.objects.create(
            owner=run.owner, run=run, tool="parcelcount__count", fingerprint=uuid.uuid4().hex, idempotency_key=uuid.uuid4().hex[:32],
            decision=ToolCall.Decision.ALLOW, pack_version=digest,
        )
        task = f"task-{call.id}"
        ReceiptRecord.objects.create(owner=run.owner, call=call, task_id=task, revision=1, status="running", receipt={}, content_fingerprint="")
        ReceiptRecord.objects.create(owner=run.owner, call=call, task_id=task, revision=2, status=status, receipt={}, content_fingerprint="")


def test_the_monitor_waits_stays_and_then_reverts_a_clear_regression(shipped: Path, tmp_path: Path, make_device: Any) -> None:
    v1 = candidate(tmp_path, 1, None)
    v2 = candidate(tmp_path, 2, v1.digest)
    publish(v1.digest)
    publish(v2.digest)
    phone = make_device("phone")
    run = Run.objects.get(id=accept_utterance(phone.device, new_client_id(), "track my parcels").run_id)

    # The gateway records which published version a call is decided on.
    decision = gateway_decide(CallRequest(str(run.id), "parcelcount__count", {}))
    assert ToolCall.objects.get(id=decision.call_id).pack_version == v2.digest

    results(run, v1.digest, ["succeeded"] * 37 + ["failed", "unknown"] + ["partial"])  # old: 2 of 40
    results(run, v2.digest, ["succeeded"] * 14 + ["failed"] * 3 + ["unknown"] * 2)  # new: 5 of 19 (+1 undecided call)
    ToolCall.objects.create(
        owner=run.owner, run=run, tool="parcelcount__count", fingerprint="x", idempotency_key="y",
        decision=ToolCall.Decision.BLOCK, pack_version=v2.digest,
    )
    assert version_figures(v1.digest) == Figures(40, 2)
    (record,) = monitor_cycle()
    assert record["action"] == "wait" and record["health"] == "ok"

    results(run, v2.digest, ["failed"])  # 6 of 20: [0.145, 0.519] against [0.014, 0.165]
    (record,) = monitor_cycle()
    assert (record["action"], record["new"]["finished"], record["new"]["bad"]) == ("stay", 20, 6)
    assert (record["new"]["low"], record["old"]["high"]) == (0.1455, 0.165)
    assert online_digest("parcelcount") == v2.digest

    results(run, v2.digest, ["succeeded"] * 4 + ["unknown"] * 6)  # 12 of 30: [0.246, 0.577]
    (record,) = monitor_cycle()
    assert record["action"] == "revert"
    assert online_digest("parcelcount") == v1.digest
    reverted = PackVersion.objects.get(digest=v2.digest)
    assert reverted.state == PackVersion.State.REVERTED and reverted.end_reason.startswith("monitoring: failed+unknown rose")
    assert reverted.monitoring["new"] == {"finished": 30, "bad": 12, "low": 0.2459, "high": 0.5768}


def test_a_failed_health_check_reverts_at_once_and_a_first_version_is_removed(shipped: Path, tmp_path: Path) -> None:
    v1 = candidate(tmp_path, 1, None)
    publish(v1.digest)
    (Path(v1.path) / "server" / "tools.py").write_text("raise SystemExit('broken')\n")
    (record,) = monitor_cycle()
    assert record["action"] == "revert"
    assert record["health"] == "the registry's copy of this version is missing or changed"
    assert online_digest("parcelcount") is None
    assert PackVersion.objects.get(digest=v1.digest).state == PackVersion.State.REVERTED


def test_packs_the_lead_maintains_are_not_monitored(shipped: Path, tmp_path: Path) -> None:
    """Shipped packs get a version history from the cycle but no Wilson comparison."""
    assert monitor_cycle() == []
    assert PackVersion.objects.filter(pack__name="demo", origin=PackVersion.Origin.SHIPPED).count() == 1
    assert not PackCandidate.objects.exists()
