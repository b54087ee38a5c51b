from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.test import Client
from django.utils import timezone

from brain.models import Run
from brain.services import accept_utterance
from capabilities import services
from capabilities.models import ReceiptRecord, ToolCall
from capabilities.services import CallRequest, decide, observe, record_receipt
from tests.conftest import new_client_id
from tests.support.gateway_support import manifest, write_pack
from yimi_project.errors import YimiError

pytestmark = pytest.mark.django_db


@pytest.fixture
def packs_dir(tmp_path: Path, settings: Any) -> Path:
    directory = tmp_path / "packs"
    directory.mkdir()
    write_pack(directory, "demo")
    write_pack(directory, "ownerly", manifest("ownerly", scopes=["owner"]))
    settings.YIMI_PACKS_DIR = directory
    return directory


@pytest.fixture
def run(make_device: Any, packs_dir: Path) -> Run:
    accepted = accept_utterance(make_device().device, new_client_id(), "please do it")
    return Run.objects.get(id=accepted.run_id)


@pytest.fixture
def guest_run(make_device: Any, packs_dir: Path) -> Run:
    accepted = accept_utterance(make_device(guest=True).device, new_client_id(), "hi")
    return Run.objects.get(id=accepted.run_id)


def call(run: Run, tool: str, **args: Any) -> services.Decision:
    return decide(CallRequest(str(run.id), tool, args))


def succeed(decision: services.Decision, result: dict[str, Any] | None = None) -> Any:
    return record_receipt(decision.call_id, result or {"receipt_schema": 1, "status": "succeeded", "effects": [{"target": "notes", "action": "write", "verification": "verified"}]})


# --- binding ----------------------------------------------------------------------------


def test_call_without_a_run_is_blocked(packs_dir: Path) -> None:
    decision = decide(CallRequest("00000000-0000-0000-0000-000000000000", "demo__read", {}))
    assert (decision.decision, decision.code) == ("block", "no_run")
    assert ToolCall.objects.count() == 0


def test_call_on_an_ended_run_is_blocked(run: Run) -> None:
    Run.objects.filter(id=run.id).update(state=Run.State.SUCCEEDED)
    assert call(run, "demo__read").code == "run_ended"


# --- trusted fields and owner_requested ----------------------------------------------------


def test_trusted_fields_override_model_supplied_ones(run: Run) -> None:
    decision = call(run, "demo__note", text="hi", run_id="evil-run", idempotency_key="evil-key", call_id="evil")
    assert decision.decision == "rewrite"
    stored = ToolCall.objects.get(id=decision.call_id)
    assert decision.arguments == {"text": "hi", "run_id": str(run.id), "idempotency_key": stored.idempotency_key}
    assert set(decision.overridden) == {"run_id", "idempotency_key", "call_id"}
    assert stored.arguments == decision.arguments


def test_idempotency_key_is_stable_for_the_same_call(run: Run) -> None:
    first = call(run, "demo__note", text="same")
    record_receipt(first.call_id, {"receipt_schema": 1, "status": "failed", "error": {"code": "REFUSED"}})  # may be tried again
    second = call(run, "demo__note", text="same")
    other = call(run, "demo__note", text="different")
    assert first.arguments["idempotency_key"] == second.arguments["idempotency_key"] != other.arguments["idempotency_key"]


def test_owner_requested_is_read_and_stripped_before_execution(run: Run) -> None:
    decision = call(run, "demo__read", key="k", owner_requested=True)
    assert decision.decision == "rewrite" and "owner_requested" not in decision.arguments
    assert ToolCall.objects.get(id=decision.call_id).owner_requested is True
    plain = call(run, "demo__read", key="k")
    assert plain.decision == "allow" and plain.arguments == {"key": "k"}
    assert ToolCall.objects.get(id=plain.call_id).owner_requested is False


# --- scope ----------------------------------------------------------------------------------


def test_tool_not_listed_for_the_runs_scope_is_blocked(guest_run: Run) -> None:
    assert call(guest_run, "ownerly__read").code == "scope"
    assert call(guest_run, "demo__read").decision == "allow"


def test_unknown_tool_is_blocked(run: Run) -> None:
    assert call(run, "demo__teleport").code == "unknown_tool"
    assert call(run, "nopack__read").code == "unknown_tool"


def test_scope_is_checked_before_category(guest_run: Run) -> None:
    # An unresolvable category on an out-of-scope tool reports the scope.
    assert call(guest_run, "ownerly__act").code == "scope"


# --- duplicates and unknowns -----------------------------------------------------------------


def test_repeating_a_succeeded_call_with_retry_forbidden_is_blocked(run: Run) -> None:
    succeed(call(run, "demo__note", text="send once"))
    again = call(run, "demo__note", text="send once")
    assert (again.decision, again.code) == ("block", "already_succeeded")
    assert "already succeeded" in again.reason
    assert call(run, "demo__note", text="something else").decision == "rewrite"


def test_a_retry_forbidden_call_is_blocked_while_the_same_call_is_running(run: Run, settings: Any) -> None:
    first = call(run, "demo__note", text="send once")
    again = call(run, "demo__note", text="send once")
    assert (again.decision, again.code) == ("block", "already_running")
    assert call(run, "demo__note", text="something else").decision == "rewrite"
    # Past its execution time (its pack capability has expired) a call without a result holds nothing.
    window = settings.PACK_CALL_TIMEOUT_SECONDS + services.CAPABILITY_GRACE_SECONDS
    ToolCall.objects.filter(id=first.call_id).update(created_at=timezone.now() - timedelta(seconds=window + 1))
    assert call(run, "demo__note", text="send once").decision == "rewrite"


def test_repeating_a_call_whose_retry_is_allowed_goes_ahead(run: Run) -> None:
    first = call(run, "demo__read", key="x")
    record_receipt(first.call_id, {"receipt_schema": 1, "status": "succeeded"})
    assert call(run, "demo__read", key="x").decision == "allow"


def test_unknown_result_blocks_a_retry_until_the_check_tool_ran(run: Run) -> None:
    first = call(run, "demo__note", text="maybe")
    record_receipt(first.call_id, {"receipt_schema": 1, "status": "failed", "error": {"code": "TIMEOUT"}})
    blocked = call(run, "demo__note", text="maybe")
    assert (blocked.decision, blocked.code) == ("block", "check_first") and "demo__read" in blocked.reason
    check = call(run, "demo__read")
    record_receipt(check.call_id, {"receipt_schema": 1, "status": "succeeded"})
    assert call(run, "demo__note", text="maybe").decision == "rewrite"


def board_pack(packs_dir: Path) -> None:
    """A pack whose ``post`` names its target (the board, or the board and thread)."""
    write_pack(packs_dir, "board", manifest("board", tools={
        "post": {"effect": "workspace", "target": "board", "retry": "after_check", "check_with": "posts"},
        "reply": {"effect": "workspace", "target": ["board", "thread"], "check_with": "posts"},
        "pin": {"effect": "workspace", "check_with": "posts"},
        "status": {"effect_by_arg": {"arg": "action", "map": {"show": "observe", "set": "workspace"}}, "check_with": "status"},
        "posts": {"effect": "observe"},
    }))


TIMEOUT = {"receipt_schema": 1, "status": "failed", "error": {"code": "TIMEOUT"}}


def test_an_unknown_result_holds_its_target_whatever_other_arguments_are_added(run: Run, packs_dir: Path) -> None:
    board_pack(packs_dir)
    record_receipt(call(run, "board__post", board="a", text="hi").call_id, TIMEOUT)
    for args in ({"text": "hi", "mood": "cheerful"}, {"text": "something else"}, {"text": "hi", "please": True, "owner_requested": True}):
        held = call(run, "board__post", board="a", **args)
        assert (held.decision, held.code) == ("block", "check_first"), args
        assert "board__posts" in held.reason
    assert call(run, "board__post", board="b", text="hi").decision == "allow"  # another target
    record_receipt(call(run, "board__posts").call_id, {"receipt_schema": 1, "status": "succeeded"})
    assert call(run, "board__post", board="a", text="hi", mood="cheerful").decision == "allow"


def test_a_target_of_several_arguments_is_held_on_all_of_them_together(run: Run, packs_dir: Path) -> None:
    board_pack(packs_dir)
    record_receipt(call(run, "board__reply", board="a", thread=1, text="hi").call_id, TIMEOUT)
    assert call(run, "board__reply", board="a", thread=1, text="hi", extra="x").code == "check_first"
    assert call(run, "board__reply", board="a", thread=2, text="hi").decision == "allow"
    assert call(run, "board__reply", board="b", thread=1, text="hi").decision == "allow"


def test_without_a_declared_target_the_listed_required_arguments_are_the_target(run: Run, packs_dir: Path, monkeypatch: Any) -> None:
    from capabilities import manifest as manifest_module

    board_pack(packs_dir)
    monkeypatch.setattr(manifest_module, "_LISTED_REQUIRED", {})
    record_receipt(call(run, "board__pin", board="a", note="x").call_id, TIMEOUT)
    # not listed in this process: the tool as a whole is the target
    assert call(run, "board__pin", board="b", note="x").code == "check_first"
    manifest_module.note_listed_tools({"board__pin": {"input_schema": {"type": "object", "required": ["board"]}}})
    assert call(run, "board__pin", board="a", note="y", extra=1).code == "check_first"
    assert call(run, "board__pin", board="b", note="x").decision == "allow"


def test_a_read_is_never_held_so_a_tool_can_be_its_own_check(run: Run, packs_dir: Path) -> None:
    board_pack(packs_dir)
    record_receipt(call(run, "board__status", action="set", text="away").call_id, TIMEOUT)
    assert call(run, "board__status", action="set", text="away").code == "check_first"
    show = call(run, "board__status", action="show")
    assert show.decision == "allow"
    record_receipt(show.call_id, {"receipt_schema": 1, "status": "succeeded"})
    assert call(run, "board__status", action="set", text="away").decision == "allow"


def test_an_interrupted_execution_holds_its_target_like_a_pack_result(run: Run, packs_dir: Path) -> None:
    board_pack(packs_dir)
    first = call(run, "board__post", board="a", text="hi")
    services.record_gateway_receipt(first.call_id, "unknown", "the execution was interrupted", check_first=True)
    assert call(run, "board__post", board="a", text="hi", again=True).code == "check_first"


# --- category and gate -------------------------------------------------------------------------


def test_unresolvable_category_is_blocked_with_no_default(run: Run) -> None:
    assert call(run, "demo__act").code == "category_unresolved"
    assert call(run, "demo__act", action="dance").code == "category_unresolved"
    assert call(run, "demo__act", action=["look"]).code == "category_unresolved"


def test_observe_and_workspace_are_allowed(run: Run) -> None:
    assert call(run, "demo__act", action="look").decision == "allow"
    assert call(run, "demo__note", text="n").decision == "rewrite"  # allowed, with trusted fields


def test_self_change_the_owner_did_not_ask_for_is_blocked_by_the_release_authority(run: Run) -> None:
    decision = call(run, "demo__act", action="fix")
    assert (decision.decision, decision.code) == ("block", "owner_request_required")
    assert decision.arguments is None


def test_a_block_writes_a_rejected_receipt_from_the_gateway(run: Run) -> None:
    decision = call(run, "demo__act", action="fix")
    record = ReceiptRecord.objects.get(call_id=decision.call_id)
    assert record.status == "rejected" and record.written_by_gateway
    with pytest.raises(YimiError) as err:
        record_receipt(decision.call_id, {"receipt_schema": 1, "status": "succeeded"})
    assert err.value.code == "call_not_executed"


# --- receipts: invariants, idempotency, revisions --------------------------------------------------


def test_success_with_unverified_effects_is_downgraded(run: Run) -> None:
    effects = [
        {"target": "a", "action": "write", "verification": "verified"},
        {"target": "b", "action": "write", "verification": "not_verified"},
    ]
    partial = record_receipt(call(run, "demo__note", text="1").call_id, {"receipt_schema": 1, "status": "succeeded", "effects": effects})
    assert partial.record.status == "partial" and partial.record.contradictions
    none = record_receipt(call(run, "demo__note", text="2").call_id, {"receipt_schema": 1, "status": "succeeded", "effects": effects[1:]})
    assert none.record.status == "unknown"
    succeed(call(run, "demo__read"))  # an unknown holds demo__note (no target: the whole tool) until checked
    no_effect = record_receipt(call(run, "demo__note", text="3").call_id, {"receipt_schema": 1, "status": "succeeded"})
    assert no_effect.record.status == "unknown"
    assert all(e["category"] == "workspace" for e in partial.record.receipt["effects"])


@pytest.mark.parametrize("code", ["TIMEOUT", "upstream_timeout", "DISCONNECTED"])
def test_timeouts_and_disconnects_are_unknown_and_need_a_check(run: Run, code: str) -> None:
    out = record_receipt(call(run, "demo__note", text=code).call_id, {"receipt_schema": 1, "status": "failed", "error": {"code": code}})
    assert out.record.status == "unknown"
    assert out.record.receipt["next"] == {"retry": "after_check", "check_with": "read"}


def test_a_number_without_unit_is_a_contract_violation(run: Run) -> None:
    result = {"receipt_schema": 1, "status": "succeeded", "values": [{"name": "count", "value": 3, "source": "x"}, {"name": "label", "value": "ok", "source": "x"}]}
    out = record_receipt(call(run, "demo__read", key="1").call_id, result)
    assert out.record.violations == ["value_without_unit: count"]
    assert [v["name"] for v in out.record.receipt["values"]] == ["label"]


def test_a_pack_may_not_write_rejected(run: Run) -> None:
    out = record_receipt(call(run, "demo__read", key="2").call_id, {"receipt_schema": 1, "status": "rejected"})
    assert out.record.status == "unknown" and out.record.violations[0].startswith("pack_wrote_rejected")


@pytest.mark.parametrize("result", [None, "done!", {"status": "succeeded"}, {"receipt_schema": 1, "status": "great"}, {"receipt_schema": 1, "status": "succeeded", "diff": []}])
def test_anything_that_is_not_a_valid_receipt_is_unknown(run: Run, result: Any) -> None:
    out = record_receipt(call(run, "demo__read", key=json.dumps(result)).call_id, result)
    assert out.record.status == "unknown" and out.record.violations[0].startswith("invalid_receipt")


def test_lost_result_is_unknown(run: Run) -> None:
    out = record_receipt(call(run, "demo__note", text="lost").call_id, None, transport_error="DISCONNECTED: host died")
    assert out.record.status == "unknown"


def test_replayed_receipt_returns_the_stored_record(run: Run) -> None:
    decision = call(run, "demo__read", key="r")
    first = record_receipt(decision.call_id, {"receipt_schema": 1, "status": "succeeded"})
    again = record_receipt(decision.call_id, {"receipt_schema": 1, "status": "succeeded"})
    assert again.replayed and again.record.pk == first.record.pk and ReceiptRecord.objects.count() == 1


def test_replay_with_different_content_is_a_conflict(run: Run) -> None:
    decision = call(run, "demo__read", key="c")
    record_receipt(decision.call_id, {"receipt_schema": 1, "status": "succeeded"})
    with pytest.raises(YimiError) as err:
        record_receipt(decision.call_id, {"receipt_schema": 1, "status": "failed"})
    assert err.value.code == "conflict"
    assert ReceiptRecord.objects.get().status == "succeeded"


def test_long_task_revisions_strictly_increase_and_history_is_kept(run: Run) -> None:
    def report(revision: int, status: str) -> Any:
        d = call(run, "demo__read", key=f"poll-{revision}-{status}")
        return record_receipt(d.call_id, {"receipt_schema": 1, "status": status, "task_id": "phone-task-1", "revision": revision})

    report(1, "running")
    report(2, "running")
    report(3, "succeeded")
    with pytest.raises(YimiError) as err:
        report(2, "failed")
    assert err.value.code == "stale_revision"
    current = services.current_receipts(["phone-task-1"])["phone-task-1"]
    assert (current.revision, current.status) == (3, "succeeded")
    assert list(ReceiptRecord.objects.filter(task_id="phone-task-1").order_by("revision").values_list("status", flat=True)) == ["running", "running", "succeeded"]


def test_observe_records_duration_and_error_only(run: Run) -> None:
    decision = call(run, "demo__read", key="o")
    out = record_receipt(decision.call_id, {"receipt_schema": 1, "status": "succeeded"})
    observe(decision.call_id, duration_ms=37, error="slow disk")
    stored = ToolCall.objects.get(id=decision.call_id)
    assert (stored.duration_ms, stored.observed_error) == (37, "slow disk")
    assert ReceiptRecord.objects.get(pk=out.record.pk).receipt == out.record.receipt
    with pytest.raises(YimiError):
        observe(decision.call_id, duration_ms=-1)


# --- HTTP on the internal listener (a Unix socket) --------------------------------------------


def over_socket(socket_path: Any, path: str, body: Any, *, token: str | None) -> Any:
    headers = {"X-Yimi-Internal-Token": token} if token is not None else {}
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path)), base_url="http://yimi.internal") as client:
        if isinstance(body, str):
            return client.post(path, content=body, headers={**headers, "Content-Type": "application/json"})
        return client.post(path, json=body, headers=headers)


def test_gateway_over_http_on_the_internal_socket(run: Run, settings: Any, internal_listener: Any) -> None:
    token = settings.INTERNAL_TOKEN
    decided = over_socket(internal_listener, "/internal/gateway/decide/", {"run_id": str(run.id), "tool": "demo__read", "arguments": {"key": "h"}}, token=token)
    assert decided.status_code == 200 and decided.json()["decision"] == "allow"
    call_id, proof = decided.json()["call_id"], decided.json()["receipt_capability"]
    stored = over_socket(internal_listener, "/internal/gateway/receipt/", {"call_id": call_id, "capability": proof, "result": {"receipt_schema": 1, "status": "succeeded"}}, token=token)
    assert stored.json()["status"] == "succeeded" and stored.json()["replayed"] is False
    assert over_socket(internal_listener, "/internal/gateway/observe/", {"call_id": call_id, "capability": proof, "duration_ms": 5}, token=token).json() == {"ok": True}
    conflict = over_socket(internal_listener, "/internal/gateway/receipt/", {"call_id": call_id, "capability": proof, "result": {"receipt_schema": 1, "status": "failed"}}, token=token)
    assert conflict.status_code == 409 and conflict.json()["error"]["code"] == "conflict"


def test_a_receipt_needs_the_capability_decide_issued_for_that_call(run: Run, settings: Any, internal_listener: Any) -> None:
    """Nobody reports on a call they are not executing: not without the call's receipt
    capability, not with another call's, not with the pack capability."""
    token = settings.INTERNAL_TOKEN
    first = over_socket(internal_listener, "/internal/gateway/decide/", {"run_id": str(run.id), "tool": "demo__read", "arguments": {"key": "1"}}, token=token).json()
    second = over_socket(internal_listener, "/internal/gateway/decide/", {"run_id": str(run.id), "tool": "demo__read", "arguments": {"key": "2"}}, token=token).json()
    result = {"receipt_schema": 1, "status": "succeeded"}
    for proof in (None, "forged", second["receipt_capability"], first["pack_capability"]):
        refused = over_socket(internal_listener, "/internal/gateway/receipt/", {"call_id": first["call_id"], "capability": proof, "result": result}, token=token)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
        observed = over_socket(internal_listener, "/internal/gateway/observe/", {"call_id": first["call_id"], "capability": proof, "duration_ms": 1}, token=token)
        assert observed.status_code == 403
    assert not ReceiptRecord.objects.filter(written_by_gateway=False).exists()
    assert ToolCall.objects.get(id=first["call_id"]).duration_ms is None


def test_gateway_http_refuses_the_public_listener_and_missing_tokens(run: Run, settings: Any, internal_listener: Any) -> None:
    body = {"run_id": str(run.id), "tool": "demo__read", "arguments": {}}
    # the public listener refuses /internal/ whatever the peer's address (a same-host proxy is loopback too)
    for ip in ("127.0.0.1", "192.0.2.7"):
        public = Client(REMOTE_ADDR=ip).post("/internal/gateway/decide/", body, content_type="application/json", HTTP_X_YIMI_INTERNAL_TOKEN=settings.INTERNAL_TOKEN)
        assert public.status_code == 403 and public.json()["error"]["code"] == "forbidden"
    assert over_socket(internal_listener, "/internal/gateway/decide/", body, token=None).status_code == 403
    wrong = over_socket(internal_listener, "/internal/gateway/decide/", body, token="wrong")
    assert wrong.status_code == 403 and wrong.json()["error"]["code"] == "forbidden"
    malformed = over_socket(internal_listener, "/internal/gateway/decide/", "{nope", token=settings.INTERNAL_TOKEN)
    assert malformed.status_code == 400 and malformed.json()["error"]["code"] == "malformed_json"
    assert ToolCall.objects.count() == 0
