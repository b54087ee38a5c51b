"""Scheduled runs and watches ("快递到了告诉我"): schedules fired by beat into real runs
with ``origin=scheduled``, watches that call a pack tool through the gateway and notify
once when its state moves, pending notices cleared only by a device's ACK, and the
``parcels`` pack against a local fake carrier speaking real HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from capabilities.contract import run_contract
from capabilities.manifest import load_pack
from capabilities.mcp_host.sandbox import PlatformPaths, grant_for
from tests.parcel_service import ParcelService

PACKS = Path(__file__).resolve().parent.parent / "packs"


def report_text(report: Any) -> str:
    lines = [f"{report.pack} ({report.implementation}): errors={report.errors}"]
    for case in report.cases:
        lines.append(f"  {'pass' if case.passed else 'FAIL'} {case.name}")
        lines.extend(f"      {f}" for f in case.failures)
    return "\n".join(lines)


def secrets_with_url(root: Path, url: str) -> Path:
    secrets = root / "secrets"
    secrets.mkdir(exist_ok=True)
    (secrets / "PARCELS_API_URL").write_text(url + "\n", encoding="utf-8")
    return secrets


# --- the parcels pack -----------------------------------------------------------------------


def test_parcels_manifest_declares_its_secret_and_egress(tmp_path: Path) -> None:
    pack = load_pack(PACKS / "parcels")
    assert (pack.secrets, pack.host, pack.tools["track"].resolve_category({})) == (["PARCELS_API_URL"], "dedicated", "observe")
    assert pack.egress  # declared, so the sandbox shares the network
    paths = PlatformPaths(tmp_path, tmp_path / "w", tmp_path / "m", secrets_with_url(tmp_path, "http://carrier.test"), None)
    grant = grant_for([pack], paths)
    assert grant.network and grant.env == {"PARCELS_API_URL": "http://carrier.test"}


def test_parcels_contract_real_against_a_fake_carrier(tmp_path: Path) -> None:
    with ParcelService() as carrier:
        paths = PlatformPaths(tmp_path / "data", tmp_path / "w", tmp_path / "m", secrets_with_url(tmp_path, carrier.url), None)
        report = run_contract(PACKS / "parcels", fake=False, paths=paths)
        assert report.passed, report_text(report)
        assert len(report.cases) == 4 and not report.skipped
        assert carrier.hits["CONTRACT-1"] == 1 and carrier.hits["NO-SUCH-PARCEL"] == 1  # it really asked the carrier


def test_parcels_contract_fake() -> None:
    report = run_contract(PACKS / "parcels", fake=True)
    assert report.passed, report_text(report)
    assert report.skipped == ["an unreachable carrier is DISCONNECTED, never a state"]
