"""The gateway's query budget (docs/decisions/2026-12-03-query-budgets.md) and its internal HTTP
fast path (``yimi_project.internal.InternalJsonEndpoints``).

The budget is counted, never timed: in autocommit, as in production, a decide + receipt
of a read is the four statements it cannot do without — the run lookup, the call's INSERT,
the call lookup and the receipt's INSERT — and a ``retry=forbidden`` call adds only the
transaction, the owner's lock and its three duplicate/unknown lookups. The fast path
answers exactly as the Django view does, on the internal listener only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator
from django.db import connection
from django.db.models.signals import pre_save
from django.test.utils import CaptureQueriesContext

from brain.models import Run
from capabilities.models import ReceiptRecord, ToolCall
from capabilities.services import CallRequest, decide, record_receipt
from tests.support.gateway_support import run_with_demo_pack
from yimi_project.infra import statements
from yimi_project.internal import _json_handler

pytestmark = pytest.mark.django_db(transaction=True)  # autocommit, as in production

# The budget: raise it only with a reason in docs/decisions/2026-12-03-query-budgets.md.
READ_QUERIES = 4  # run lookup, INSERT call, call lookup, INSERT receipt
FORBIDDEN_QUERIES = 10  # + BEGIN, owner lock, last result, running, unchecked target, COMMIT

RESULT = {"receipt_schema": 1, "status": "succeeded", "values": [{"name": "answer", "value": 42, "unit": "unit", "source": "t"}]}
NOTED = {"receipt_schema": 1, "status": "succeeded", "effects": [{"target": "notes", "action": "write", "verification": "verified"}]}


@pytest.fixture
def run(make_device: Any, tmp_path: Path, settings: Any) -> Run:
    return run_with_demo_pack(make_device().device, tmp_path, settings)


def decide_and_receipt(run: Run, tool: str, arguments: dict[str, Any], result: dict[str, Any]) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        decision = decide(CallRequest(str(run.id), tool, arguments))
        assert decision.executes, decision
        outcome = record_receipt(decision.call_id, result)
    assert outcome.record.status == "succeeded" and not outcome.replayed
    return [q["sql"] for q in queries.captured_queries]


def test_decide_and_receipt_of_a_read_stay_within_the_query_budget(run: Run) -> None:
    decide_and_receipt(run, "demo__read", {"key": "warm"}, RESULT)  # first use: pack manifests, prepared statements
    issued = decide_and_receipt(run, "demo__read", {"key": "counted"}, RESULT)
    assert len(issued) <= READ_QUERIES, "\n".join(issued)
    # No transaction or lock of its own: each INSERT commits by itself.
    assert not any(sql.startswith(("BEGIN", "SAVEPOINT", "SELECT pg_advisory")) for sql in issued), issued


def test_a_retry_forbidden_call_keeps_its_lock_within_the_query_budget(run: Run) -> None:
    decide_and_receipt(run, "demo__note", {"text": "warm"}, NOTED)
    issued = decide_and_receipt(run, "demo__note", {"text": "counted"}, NOTED)
    assert len(issued) <= FORBIDDEN_QUERIES, "\n".join(issued)
    # The owner's lock (memory.locks): PostgreSQL's advisory lock; on SQLite (the embedded
    # default) the transaction's BEGIN IMMEDIATE is it, the database's one write lock.
    lock = "pg_advisory_xact_lock" if connection.vendor == "postgresql" else "BEGIN"
    assert any(lock in sql for sql in issued), "the duplicate check must stay under the owner's lock"
    # and the lock still does its job: the same call again is refused
    again = decide(CallRequest(str(run.id), "demo__note", {"text": "counted"}))
    assert (again.decision, again.code) == ("block", "already_succeeded")


def test_a_receipt_replayed_in_autocommit_returns_the_stored_record(run: Run) -> None:
    """Without a savepoint of its own the receipt's INSERT still settles a replay by the
    ledger's unique key, and the connection stays usable."""
    decision = decide(CallRequest(str(run.id), "demo__read", {"key": "again"}))
    first = record_receipt(decision.call_id, RESULT)
    second = record_receipt(decision.call_id, RESULT)
    assert second.replayed and second.record.id == first.record.id
    assert ReceiptRecord.objects.filter(call_id=decision.call_id).count() == 1


# --- yimi_project.infra.statements ---------------------------------------------------------------


def test_statements_insert_and_fetch_as_the_orm_would(run: Run) -> None:
    call = ToolCall(owner_id=run.owner_id, run=run, tool="demo__read", arguments={"键": [1, "二"]}, fingerprint="f" * 64,
                    idempotency_key="k", decision=ToolCall.Decision.ALLOW)
    statements.insert(call)
    assert call.created_at is not None and not call._state.adding
    record = ReceiptRecord(owner_id=run.owner_id, call=call, task_id=str(call.id), status="succeeded", receipt=RESULT,
                           content_fingerprint="c")
    statements.insert(record)
    assert record.id == ReceiptRecord.objects.get().id  # the auto id came back from the INSERT
    stored = ToolCall.objects.get(id=call.id)
    assert (stored.arguments, stored.created_at, stored.fingerprint) == ({"键": [1, "二"]}, call.created_at, "f" * 64)
    fetched = statements.fetch_by_pk(ToolCall, call.id, ("arguments", "owner", "tool"))
    assert fetched is not None and (fetched.arguments, fetched.owner_id, fetched.tool) == (stored.arguments, run.owner_id, "demo__read")
    assert fetched.get_deferred_fields() >= {"fingerprint", "decision"}
    assert fetched.decision == "allow"  # a deferred field loads on access, as with only()
    assert statements.fetch_by_pk(ToolCall, "00000000-0000-0000-0000-000000000000", ("tool",)) is None


def test_statements_insert_runs_save_signals_when_a_model_has_receivers(run: Run) -> None:
    seen: list[Any] = []

    def receiver(sender: Any, instance: Any, **kwargs: Any) -> None:
        seen.append(instance)

    pre_save.connect(receiver, sender=ToolCall)
    try:
        call = ToolCall(owner_id=run.owner_id, run=run, tool="demo__read", fingerprint="f", idempotency_key="k", decision="allow")
        statements.insert(call)
    finally:
        pre_save.disconnect(receiver, sender=ToolCall)
    assert seen == [call] and ToolCall.objects.filter(id=call.id).exists()


# --- the internal JSON fast path (ASGI, before Django's middleware) -------------------------


def post(path: str, body: bytes | dict[str, Any], *, token: str | None, internal: bool = True, method: str = "POST") -> tuple[int, dict[str, str], Any]:
    """One request through the project's ASGI application, as daphne hands it over: on the
    internal Unix socket a scope has neither client nor server address."""
    from django.conf import settings

    from yimi_project.asgi import application

    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = [(b"host", settings.INTERNAL_HOST.encode()), (b"content-type", b"application/json")]
    if token is not None:
        headers.append((b"x-yimi-internal-token", token.encode()))
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": headers,
        "client": None if internal else ("127.0.0.1", 50000), "server": None if internal else ("127.0.0.1", 8000),
    }
    from asgiref.sync import async_to_sync

    async def exchange() -> tuple[int, dict[str, str], Any]:
        app = ApplicationCommunicator(application, scope)
        await app.send_input({"type": "http.request", "body": raw, "more_body": False})
        start = await app.receive_output(10)
        content = b""
        while True:
            message = await app.receive_output(10)
            content += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
        return start["status"], headers, json.loads(content) if content else None

    return async_to_sync(exchange)()


def test_the_fast_path_serves_decide_receipt_and_observe_on_the_internal_listener(run: Run, settings: Any) -> None:
    status, headers, decided = post("/internal/gateway/decide/", {"run_id": str(run.id), "tool": "demo__read", "arguments": {"key": "a"}},
                                    token=settings.INTERNAL_TOKEN)
    assert status == 200 and decided["decision"] == "allow" and headers["content-type"] == "application/json"
    assert "x-frame-options" not in headers  # answered before Django's middleware
    proof = decided["receipt_capability"]
    status, _, stored = post("/internal/gateway/receipt/", {"call_id": decided["call_id"], "capability": proof, "result": RESULT},
                             token=settings.INTERNAL_TOKEN)
    assert status == 200 and (stored["status"], stored["replayed"]) == ("succeeded", False)
    status, _, observed = post("/internal/gateway/observe/", {"call_id": decided["call_id"], "capability": proof, "duration_ms": 3},
                               token=settings.INTERNAL_TOKEN)
    assert (status, observed) == (200, {"ok": True})
    assert ToolCall.objects.get(id=decided["call_id"]).duration_ms == 3
    status, _, conflict = post("/internal/gateway/receipt/", {"call_id": decided["call_id"], "capability": proof,
                                                              "result": {"receipt_schema": 1, "status": "failed"}}, token=settings.INTERNAL_TOKEN)
    assert status == 409 and conflict["error"]["code"] == "conflict"
    status, _, refused = post("/internal/gateway/receipt/", {"call_id": decided["call_id"], "capability": decided["pack_capability"],
                                                             "result": RESULT}, token=settings.INTERNAL_TOKEN)
    assert status == 403 and refused["error"]["code"] == "forbidden"


@pytest.mark.parametrize(
    ("token", "method", "body", "status", "code"),
    [
        (None, "POST", b"{}", 403, "forbidden"),
        ("wrong", "POST", b"{}", 403, "forbidden"),
        ("right", "GET", b"", 400, "invalid_request"),
        ("right", "POST", b"{nope", 400, "malformed_json"),
        ("right", "POST", b"\xff\xfe", 400, "malformed_json"),
        ("right", "POST", b"[1, 2]", 400, "invalid_request"),
        ("right", "POST", b"{}", 400, "invalid_request"),  # decide without run_id and tool
    ],
)
def test_the_fast_path_refuses_what_the_view_refuses_and_changes_nothing(
    run: Run, settings: Any, token: str | None, method: str, body: bytes, status: int, code: str
) -> None:
    sent = settings.INTERNAL_TOKEN if token == "right" else token
    answered, _, payload = post("/internal/gateway/decide/", body, token=sent, method=method)
    assert (answered, payload["error"]["code"]) == (status, code)
    assert ToolCall.objects.count() == 0


def test_the_fast_path_keeps_djangos_body_size_limit(run: Run, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = {"run_id": str(run.id), "tool": "demo__read", "arguments": {"key": "x" * 2000}}
    status, _, payload = post("/internal/gateway/decide/", body, token=settings.INTERNAL_TOKEN)
    assert (status, payload["error"]["code"]) == (413, "payload_too_large")
    assert ToolCall.objects.count() == 0


def test_the_public_listener_still_goes_through_django_and_is_refused(run: Run, settings: Any) -> None:
    body = {"run_id": str(run.id), "tool": "demo__read", "arguments": {}}
    status, headers, payload = post("/internal/gateway/decide/", body, token=settings.INTERNAL_TOKEN, internal=False)
    assert (status, payload["error"]["code"]) == (403, "forbidden")
    assert "x-frame-options" in headers  # Django's middleware answered
    assert ToolCall.objects.count() == 0


def test_only_internal_json_views_take_the_fast_path() -> None:
    assert _json_handler("/internal/gateway/decide/") is not None
    assert _json_handler("/internal/gateway/decide") is None  # Django's APPEND_SLASH and 404 as before
    assert _json_handler("/api/health/") is None
    assert _json_handler("/nowhere/") is None
