"""Capability packs: manifests, contract tests (real servers and fakes), the messaging
pack's local outbox (a Maildir; nothing is sent), and the reminders behind the schedule pack (services, internal API, firing)."""

from __future__ import annotations

import email.policy
import mailbox
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from email.parser import BytesParser
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from capabilities import truth
from capabilities.contract import matches, run_contract, substitute
from capabilities.manifest import load_pack
from capabilities.mcp_host.host import load_tools_module
from capabilities.receipts import normalize, schema_errors
from memory.models import TimelineEntry
from schedules import reminders
from schedules.models import Reminder
from tests.conftest import db_async, internal_client, open_socket, pack_capability, platform_paths, receive_until
from yimi_project.errors import HTTP_STATUS, YimiError
from yimi_project.internal import TOKEN_HEADER

PACKS = Path(__file__).resolve().parents[2] / "packs"
ALL_PACKS = ("workspace", "messaging", "schedule")


def report_text(report: Any) -> str:
    lines = [f"{report.pack} ({report.implementation}): errors={report.errors}"]
    for case in report.cases:
        lines.append(f"  {'pass' if case.passed else 'FAIL'} {case.name}")
        lines.extend(f"      {f}" for f in case.failures)
    return "\n".join(lines)


def pack_tools(name: str, fake: bool = False) -> Any:
    return load_tools_module(load_pack(PACKS / name), fake).tools


# --- manifests ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_PACKS)
def test_manifest_validates(name: str) -> None:
    pack = load_pack(PACKS / name)
    assert pack.name == name
    for fake in (False, True):
        assert set(pack_tools(name, fake)) == set(pack.tools)


def test_messaging_manifest_declares_its_effects() -> None:
    pack = load_pack(PACKS / "messaging")
    send = pack.tools["send"]
    assert pack.scopes == ["owner"]
    assert pack.tools["list"].resolve_category({}) == "observe"
    assert send.resolve_category({"action": "send"}) == "send"
    assert send.resolve_category({"action": "draft"}) == "workspace"
    assert send.resolve_category({"action": "shout"}) is None
    assert (send.target_of({"to": "a@b.c"}), send.task_type, send.retry, send.check_with) == ("a@b.c", "message", "forbidden", "list")
    assert send.context_inject == ["idempotency_key"]


def test_schedule_manifest_declares_its_effects() -> None:
    pack = load_pack(PACKS / "schedule")
    create = pack.tools["create_reminder"]
    assert (pack.egress, pack.secrets, pack.platform_api, pack.host) == ([], [], ["reminders"], "dedicated")
    assert create.resolve_category({}) == "owner_data" and pack.tools["cancel_reminder"].resolve_category({}) == "owner_data"
    assert pack.tools["list_reminders"].resolve_category({}) == "observe"
    assert (create.context_inject, create.retry, create.check_with) == (["idempotency_key"], "after_check", "list_reminders")


# --- the contract runner ----------------------------------------------------------------------


@pytest.mark.parametrize("fake", [False, True], ids=["real", "fake"])
@pytest.mark.parametrize("name", ["workspace", "messaging"])
def test_contract(name: str, fake: bool) -> None:
    report = run_contract(PACKS / name, fake=fake)
    assert report.passed, report_text(report)
    assert report.cases and not report.skipped


def test_contract_schedule_fake() -> None:
    report = run_contract(PACKS / "schedule", fake=True)
    assert report.passed, report_text(report)
    assert report.skipped == ["an unreachable platform is DISCONNECTED, never a success"]


@pytest.mark.django_db(transaction=True)
def test_contract_schedule_real_against_the_platform(internal_listener: Any, settings: Any, owner: Any) -> None:
    report = run_contract(PACKS / "schedule", fake=False, owner_id=owner.pk)
    assert report.passed, report_text(report)
    assert len(report.cases) == 4 and not report.skipped
    # the platform really stored the reminder, once, and the contract cancelled it
    made = Reminder.objects.get(owner=owner)
    assert made.state == Reminder.State.CANCELLED and made.idempotency_key.startswith("contract-")


def test_contract_failures_are_reported(tmp_path: Path) -> None:
    copy = tmp_path / "workspace"
    shutil.copytree(PACKS / "workspace", copy)
    contract = copy / "tests" / "contract.yaml"
    contract.write_text(contract.read_text(encoding="utf-8").replace("value: 12, unit: byte}]\n      - tool: read_file", "value: 13, unit: byte}]\n      - tool: read_file"), encoding="utf-8")
    report = run_contract(copy, fake=True)
    assert not report.passed
    failed = [c for c in report.cases if not c.passed]
    assert [c.name for c in failed] == ["write then read back"]
    assert any("bytes_written" in f for f in failed[0].failures)


def test_contract_rejects_a_result_that_is_not_a_receipt(tmp_path: Path) -> None:
    copy = tmp_path / "workspace"
    shutil.copytree(PACKS / "workspace", copy)
    fake = copy / "fake" / "tools.py"
    fake.write_text(fake.read_text(encoding="utf-8").replace(
        'return receipt("succeeded", summary=f"{len(files)} files"', 'return {"status": "fine", "files": files}\n    return receipt("succeeded", summary=f"{len(files)} files"'),
        encoding="utf-8")
    contract = copy / "tests" / "contract.yaml"
    contract.write_text(contract.read_text(encoding="utf-8") + "  - name: list\n    steps:\n      - tool: list_files\n        expect: {status: fine}\n", encoding="utf-8")
    report = run_contract(copy, fake=True)
    case = next(c for c in report.cases if c.name == "list")
    assert not case.passed and any("not a valid receipt" in f for f in case.failures)


def test_contract_refuses_unknown_expect_keys(tmp_path: Path) -> None:
    copy = tmp_path / "workspace"
    shutil.copytree(PACKS / "workspace", copy)
    contract = copy / "tests" / "contract.yaml"
    contract.write_text(contract.read_text(encoding="utf-8").replace("error_code: not_found", "eror_code: not_found"), encoding="utf-8")
    report = run_contract(copy, fake=True)
    assert not report.passed and "eror_code" in report.errors[0]


def test_matching_and_substitution() -> None:
    assert matches({"a": 1}, {"a": 1, "b": 2}) and not matches({"a": 1}, {"a": True})
    assert not matches({"value": False}, {"value": 0}) and matches([1, {"x": 2}], [1, {"x": 2, "y": 3}])
    assert substitute({"id": "${rid}", "t": "r:${rid}", "n": ["${n}"]}, {"rid": "abc", "n": 3}) == {"id": "abc", "t": "r:abc", "n": [3]}
    with pytest.raises(KeyError):
        substitute("${missing}", {})


@pytest.mark.django_db
def test_pack_contract_command(capsys: Any, tmp_path: Path) -> None:
    call_command("pack_contract", "workspace", "messaging", "--both")
    out = capsys.readouterr().out
    assert "4/4 contract runs passed" in out and "messaging  fake  pass" in out
    broken = tmp_path / "packs"
    shutil.copytree(PACKS / "workspace", broken / "workspace")
    (broken / "workspace" / "tests" / "contract.yaml").write_text("pack: workspace\ncases: []\n", encoding="utf-8")
    with pytest.raises(CommandError):
        call_command("pack_contract", "--fake", "--packs-dir", str(broken))
    assert "ERROR" in capsys.readouterr().out


# --- messaging: the local outbox (nothing leaves this host) --------------------------------


def read_folder(root: Path, name: str) -> list[Any]:
    box = mailbox.Maildir(root, create=False).get_folder(name)
    return [BytesParser(policy=email.policy.default).parsebytes(box.get_bytes(k)) for k in box.iterkeys()]


def test_messaging_contract_writes_a_real_maildir_outbox_and_delivers_to_nobody(tmp_path: Path) -> None:
    report = run_contract(PACKS / "messaging", fake=False, paths=platform_paths(tmp_path, mail_dir=tmp_path))
    assert report.passed, report_text(report)
    outbox = read_folder(tmp_path, "outbox")
    assert sorted(str(m["To"]) for m in outbox) == ["alice@example.com", "bob@example.com"]  # the retried one stored once
    (alice,) = [m for m in outbox if str(m["To"]) == "alice@example.com"]
    assert str(alice["From"]) == "Yimi <yimi@localhost>" and str(alice["Subject"]) == "Hello"
    assert alice.get_content() == "你好 Alice, see you at 9.\n" and alice.get_content_charset() == "utf-8"
    assert alice["Message-ID"] and alice["Date"]
    (draft,) = read_folder(tmp_path, "drafts")
    assert str(draft["To"]) == "carol@example.com"
    # nothing pretends to be a recipient's mailbox: the outbox and the drafts are all there is
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".") and p.is_dir()) == [".drafts", ".outbox"]


def test_messaging_send_says_it_saved_to_the_local_outbox_and_sent_nothing(tmp_path: Path, monkeypatch: Any) -> None:
    """Until a mail server is configured the send's receipt claims exactly what it did: a
    verified save on the local outbox, failed/not_sent, no send effect and no 已发送."""
    monkeypatch.setenv("YIMI_MAIL_DIR", str(tmp_path))
    send = pack_tools("messaging")["send"].handler
    args = {"action": "send", "to": "Dora <dora@example.com>", "subject": "周末", "body": "周六见", "idempotency_key": "k-1"}
    first = send(args)
    assert (first["status"], first["error"]["code"], first["next"]) == ("failed", "not_sent", {"retry": "forbidden"})
    assert first["effects"] == [{"target": "local outbox", "action": "save", "verification": "verified"}]
    assert "local outbox" in first["summary"] and "not handed to any mail server" in first["summary"]
    assert not first["summary"].startswith("sent")
    assert {"name": "recipients", "value": 1, "unit": "person", "source": "local outbox"} in first["values"]
    assert first["content"]["items"][0]["folder"] == "outbox" and not schema_errors(first)
    pack = load_pack(PACKS / "messaging")
    normalized = normalize(first, tool=pack.tools["send"], category="send")
    assert not normalized.violations and not normalized.contradictions
    facts = truth.render_facts(normalized.receipt, tool_label="messaging send", key="k")
    for fact in facts:
        assert not any(word in text for text in (fact.text, fact.voice) for word in ("已发送", "会收到", "已送达", "sent")), fact
    assert "已保存local outbox。" in [f.voice for f in facts]
    # the same key again: the first message, nothing new stored
    message_id = first["content"]["items"][0]["message_id"]
    again = send(args)
    assert again["content"]["items"][0]["message_id"] == message_id and again["status"] == "failed"
    assert {"name": "replayed", "value": True, "unit": None, "source": "local outbox"} in again["values"]
    assert len(read_folder(tmp_path, "outbox")) == 1
    # without a key, a second call is a second message
    other = send({**args, "idempotency_key": None})
    assert other["content"]["items"][0]["message_id"] != message_id
    assert len(read_folder(tmp_path, "outbox")) == 2
    listed = pack_tools("messaging")["list"].handler({"folder": "outbox", "to": "dora@example.com"})
    assert message_id in [i["message_id"] for i in listed["content"]["items"]] and listed["values"][0]["value"] == 2


def test_messaging_receipts_normalize_cleanly(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("YIMI_MAIL_DIR", str(tmp_path))
    pack = load_pack(PACKS / "messaging")
    for action, status in (("send", "failed"), ("draft", "succeeded")):
        args = {"action": action, "to": "eve@example.com", "subject": "s", "body": "b"}
        raw = pack_tools("messaging")["send"].handler(args)
        result = normalize(raw, tool=pack.tools["send"], category=pack.tools["send"].resolve_category(args))
        assert result.receipt["status"] == status and not result.violations and not result.contradictions
        assert result.receipt["effects"][0]["category"] == {"send": "send", "draft": "workspace"}[action]


# --- schedule: the real server's transport ------------------------------------------------


def test_schedule_server_reports_disconnected_and_timeout(monkeypatch: Any, tmp_path: Path) -> None:
    from capabilities.packkit import run_with_capability

    create = pack_tools("schedule")["create_reminder"].handler
    args = {"text": "x", "due_at": "2099-01-01T00:00:00+00:00"}
    monkeypatch.setenv("YIMI_PLATFORM_SOCKET", str(tmp_path / "nobody.sock"))
    lost = run_with_capability(create, args, "capability")
    assert (lost["status"], lost["error"]["code"], lost["next"]) == ("unknown", "DISCONNECTED", {"retry": "after_check", "check_with": "list_reminders"})

    silent = socket.socket(socket.AF_UNIX)
    silent.bind(str(tmp_path / "silent.sock"))
    silent.listen(1)  # accepts the connection and never answers
    try:
        monkeypatch.setenv("YIMI_PLATFORM_SOCKET", str(tmp_path / "silent.sock"))
        monkeypatch.setenv("YIMI_PLATFORM_TIMEOUT", "0.3")
        timed_out = run_with_capability(create, args, "capability")
    finally:
        silent.close()
    assert (timed_out["status"], timed_out["error"]["code"]) == ("unknown", "TIMEOUT")
    pack = load_pack(PACKS / "schedule")
    for raw in (lost, timed_out):
        assert not schema_errors(raw)
        assert not normalize(raw, tool=pack.tools["create_reminder"], category="owner_data").violations


def test_schedule_server_needs_the_platform_socket_and_a_call_capability(monkeypatch: Any, tmp_path: Path) -> None:
    from capabilities.packkit import run_with_capability

    listing = pack_tools("schedule")["list_reminders"].handler
    monkeypatch.delenv("YIMI_PLATFORM_SOCKET", raising=False)
    result = run_with_capability(listing, {}, "capability")
    assert (result["status"], result["error"]["code"]) == ("failed", "not_configured")
    monkeypatch.setenv("YIMI_PLATFORM_SOCKET", str(tmp_path / "nobody.sock"))
    result = listing({})  # called outside a platform call: no capability, nothing sent
    assert (result["status"], result["error"]["code"]) == ("failed", "not_configured")


# --- reminders: services ---------------------------------------------------------------------


def future(**delta: float) -> Any:
    return timezone.now() + timedelta(**(delta or {"hours": 1}))


def test_reminder_services(owner: Any) -> None:
    first, created = reminders.create_reminder(owner, "  买牛奶 ", future(), idempotency_key="k1")
    assert created and first.text == "买牛奶" and first.state == Reminder.State.SCHEDULED
    again, created = reminders.create_reminder(owner, "买牛奶", future(), idempotency_key="k1")
    assert not created and again.id == first.id
    later, _ = reminders.create_reminder(owner, "开会", "2099-01-01T09:00:00+08:00")
    assert reminders.serialize_reminder(later)["due_at"] == "2099-01-01T01:00:00+00:00"
    assert [r.id for r in reminders.list_reminders(owner)] == [first.id, later.id]

    cancelled = reminders.cancel_reminder(owner, first.id)
    assert cancelled.state == Reminder.State.CANCELLED and cancelled.cancelled_at is not None
    assert reminders.cancel_reminder(owner, str(first.id)).state == Reminder.State.CANCELLED  # a retried cancel
    assert [r.id for r in reminders.list_reminders(owner)] == [later.id]
    assert {r.id for r in reminders.list_reminders(owner, include_done=True)} == {first.id, later.id}


@pytest.mark.parametrize(
    "text,due",
    [("x", "2099-01-01T09:00:00"), ("x", "2000-01-01T00:00:00+00:00"), ("x", "tomorrow"), ("", "2099-01-01T09:00:00+00:00"), ("x" * 501, "2099-01-01T09:00:00+00:00")],
)
def test_reminder_create_refuses_bad_input(owner: Any, text: str, due: str) -> None:
    with pytest.raises(YimiError) as exc:
        reminders.create_reminder(owner, text, due)
    assert exc.value.code == "invalid_request"
    assert not Reminder.objects.exists()


def test_reminder_replay_after_its_time_returns_the_original(owner: Any) -> None:
    made, _ = reminders.create_reminder(owner, "x", future(), idempotency_key="k")
    Reminder.objects.filter(id=made.id).update(due_at=timezone.now() - timedelta(minutes=1))
    again, created = reminders.create_reminder(owner, "x", future(), idempotency_key="k")
    assert again.id == made.id and not created


def test_reminder_cancel_errors(owner: Any) -> None:
    with pytest.raises(YimiError) as exc:
        reminders.cancel_reminder(owner, "00000000-0000-4000-8000-000000000000")
    assert exc.value.code == "not_found"
    with pytest.raises(YimiError) as exc:
        reminders.cancel_reminder(owner, "nonsense")
    assert exc.value.code == "not_found"
    made, _ = reminders.create_reminder(owner, "x", future(seconds=30))
    assert reminders.fire_due_reminders(now=future(minutes=1)) == 1
    with pytest.raises(YimiError) as exc:
        reminders.cancel_reminder(owner, made.id)
    assert exc.value.code == "reminder_already_fired"
    assert Reminder.objects.get(id=made.id).state == Reminder.State.FIRED


@pytest.mark.django_db(transaction=True)
async def test_fire_due_reminders_fires_once_into_the_timeline(owner: Any, make_device: Any) -> None:
    """A due reminder becomes one ``notice`` entry, and a connected device hears of it over
    its socket (the channel layer and the consumer, as in production) exactly once."""
    phone = await db_async(make_device)("phone")
    comm, _ = await open_socket(phone)
    create, cancel, fire = (db_async(f) for f in (reminders.create_reminder, reminders.cancel_reminder, reminders.fire_due_reminders))
    due, _ = await create(owner, "给妈妈打电话", future(seconds=30))
    later, _ = await create(owner, "later", future(hours=2))
    dropped, _ = await create(owner, "dropped", future(seconds=20))
    await cancel(owner, dropped.id)

    assert await fire(now=future(minutes=1)) == 1
    assert await fire(now=future(minutes=2)) == 0

    entry = await db_async(TimelineEntry.objects.get)(owner=owner)
    assert (entry.kind, entry.text, entry.notice_code) == ("notice", "⏰ 提醒：给妈妈打电话", "reminder")
    due = await db_async(Reminder.objects.get)(id=due.id)
    assert due.state == Reminder.State.FIRED and due.fired_entry_id == entry.id and due.fired_at is not None
    assert (await db_async(Reminder.objects.get)(id=later.id)).state == Reminder.State.SCHEDULED
    assert (await db_async(Reminder.objects.get)(id=dropped.id)).state == Reminder.State.CANCELLED

    # The later reminder fires too: what the socket gets up to its entry is everything the
    # firings sent, in order, so a second announcement of the first one would show here.
    assert await fire(now=future(hours=3)) == 1
    last = await db_async(TimelineEntry.objects.get)(owner=owner, text="⏰ 提醒：later")
    heard: list[dict[str, Any]] = []
    while not heard or heard[-1] != {"type": "timeline.new", "seq": last.seq}:
        heard.append(await receive_until(comm, "notice", "timeline.new"))
    assert heard == [
        {"type": "notice", "seq": entry.seq, "code": "reminder", "text": entry.text, "run_id": None, "reply_to_seq": None},
        {"type": "timeline.new", "seq": entry.seq},
        {"type": "notice", "seq": last.seq, "code": "reminder", "text": last.text, "run_id": None, "reply_to_seq": None},
        {"type": "timeline.new", "seq": last.seq},
    ]
    await comm.disconnect()


WORKER_TASKS = "from yimi_project.celery import app; app.loader.import_default_modules(); print(*sorted(app.tasks))"


def test_reminder_task_is_registered_under_its_beat_name(owner: Any, settings: Any) -> None:
    """Beat sends the task name in its schedule; a worker, which finds its tasks by
    autodiscovery (a fresh process here, as a worker starts), knows a task by that name,
    and that task fires due reminders."""
    from yimi_project.celery import app

    beat_name = settings.CELERY_BEAT_SCHEDULE["fire-due-reminders"]["task"]
    assert beat_name == "brain.tasks.fire_due_reminders"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "yimi_project.test_settings"}
    worker = subprocess.run([sys.executable, "-c", WORKER_TASKS], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert beat_name in worker.stdout.split(), worker.stderr
    due, _ = reminders.create_reminder(owner, "到点了", future(seconds=30))
    Reminder.objects.filter(id=due.id).update(due_at=timezone.now() - timedelta(seconds=1))
    later, _ = reminders.create_reminder(owner, "x", future(hours=1))
    app.loader.import_default_modules()  # as the worker did
    assert app.tasks[beat_name]() == 1
    assert Reminder.objects.get(id=due.id).state == Reminder.State.FIRED
    assert Reminder.objects.get(id=later.id).state == Reminder.State.SCHEDULED
    assert list(TimelineEntry.objects.values_list("kind", "text")) == [("notice", "⏰ 提醒：到点了")]


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_firings_fire_once(owner: Any) -> None:
    made, _ = reminders.create_reminder(owner, "once", future(seconds=30))
    now, results, barrier = future(minutes=1), [], threading.Barrier(2)

    def beat() -> None:
        try:
            barrier.wait()
            results.append(reminders.fire_due_reminders(now=now))
        finally:
            connection.close()

    threads = [threading.Thread(target=beat) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [0, 1]
    assert TimelineEntry.objects.filter(owner=owner, notice_code="reminder").count() == 1
    assert Reminder.objects.get(id=made.id).state == Reminder.State.FIRED


# --- reminders: the internal HTTP API ----------------------------------------------------


def internal(owner: Any, category: str = "owner_data", **target: Any) -> Client:
    """The schedule pack executing one call the gateway decided as ``category``."""
    cap = pack_capability(getattr(owner, "pk", owner), pack="schedule", category=category, apis=["reminders"], **target)
    return internal_client(**{"X-Yimi-Call-Capability": cap})


def test_internal_reminder_api(owner: Any, settings: Any) -> None:
    client = internal(owner)
    body = {"text": "交房租", "due_at": "2099-03-01T09:00:00+08:00", "idempotency_key": "api-1"}
    made = client.post("/internal/reminders/", body, content_type="application/json")
    assert made.status_code == 201, made.content
    reminder = made.json()["reminder"]
    assert made.json()["created"] is True and reminder["state"] == "scheduled" and reminder["due_at"] == "2099-03-01T01:00:00+00:00"
    replay = client.post("/internal/reminders/", body, content_type="application/json")
    assert replay.status_code == 200 and replay.json() == {"reminder": reminder, "created": False}
    assert [r["id"] for r in internal(owner, "observe").get("/internal/reminders/").json()["reminders"]] == [reminder["id"]]

    cancel = internal(owner, reminder_id=reminder["id"]).post(f"/internal/reminders/{reminder['id']}/cancel/")
    assert cancel.status_code == 200 and cancel.json()["reminder"]["state"] == "cancelled"
    assert client.get("/internal/reminders/").json()["reminders"] == []
    assert [r["state"] for r in client.get("/internal/reminders/?include_done=1").json()["reminders"]] == ["cancelled"]

    missing = client.post("/internal/reminders/00000000-0000-4000-8000-000000000000/cancel/")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    naive = client.post("/internal/reminders/", {"text": "x", "due_at": "2099-03-01T09:00:00"}, content_type="application/json")
    assert naive.status_code == 400 and naive.json()["error"]["code"] == "invalid_request"
    not_object = client.post("/internal/reminders/", [1], content_type="application/json")
    assert not_object.status_code == 400 and not_object.json()["error"]["code"] == "invalid_request"

    fired, _ = reminders.create_reminder(owner, "x", future(seconds=30))
    reminders.fire_due_reminders(now=future(minutes=1))
    refused = client.post(f"/internal/reminders/{fired.id}/cancel/")
    assert refused.status_code == HTTP_STATUS.get("reminder_already_fired", 400)
    assert refused.json()["error"]["code"] == "reminder_already_fired"


def _expired(owner: Any) -> str:
    from yimi_project import call_capability

    claims = {"call": "c", "owner": owner.pk, "pack": "schedule", "tool": "schedule__x", "category": "owner_data", "target": {}, "apis": ["reminders"]}
    return call_capability.mint(call_capability.PACK, claims, ttl_seconds=60, now=time.time() - 3600)


@pytest.mark.parametrize(
    "make_client",
    [
        lambda s, o: internal_client(),  # no capability
        lambda s, o: internal_client(**{"X-Yimi-Call-Capability": "forged"}),
        lambda s, o: internal_client(**{TOKEN_HEADER: s.INTERNAL_TOKEN}),  # the platform's token is not a pack's
        lambda s, o: internal_client(**{"X-Yimi-Call-Capability": pack_capability(o.pk, pack="memory", category="owner_data", apis=["memory"])}),
        lambda s, o: internal_client(**{"X-Yimi-Call-Capability": _expired(o)}),
        # a valid capability on the public listener, from any address
        lambda s, o: Client(headers={"X-Yimi-Call-Capability": pack_capability(o.pk, pack="schedule", category="owner_data", apis=["reminders"])}),
        lambda s, o: Client(REMOTE_ADDR="10.0.0.5", headers={TOKEN_HEADER: s.INTERNAL_TOKEN}),
    ],
    ids=["no-capability", "forged", "internal-token", "other-api", "expired", "public-listener", "public-with-token"],
)
def test_internal_reminder_api_refuses(owner: Any, settings: Any, make_client: Any) -> None:
    made, _ = reminders.create_reminder(owner, "keep", future())
    client = make_client(settings, owner)
    body = {"text": "x", "due_at": "2099-01-01T00:00:00+00:00"}
    for response in (
        client.post("/internal/reminders/", body, content_type="application/json"),
        client.get("/internal/reminders/"),
        client.post(f"/internal/reminders/{made.id}/cancel/"),
    ):
        assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
    assert list(Reminder.objects.values_list("text", "state")) == [("keep", "scheduled")]


def test_a_capability_allows_only_what_the_gateway_decided_for_its_call(owner: Any) -> None:
    """A read call cannot write; a cancel call on one reminder cannot cancel another."""
    keep, _ = reminders.create_reminder(owner, "keep", future())
    other, _ = reminders.create_reminder(owner, "other", future())
    reading = internal(owner, "observe")
    refused = reading.post("/internal/reminders/", {"text": "x", "due_at": "2099-01-01T00:00:00+00:00"}, content_type="application/json")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    wrong_target = internal(owner, reminder_id=other.id).post(f"/internal/reminders/{keep.id}/cancel/")
    assert wrong_target.status_code == 403
    assert list(Reminder.objects.order_by("text").values_list("text", "state")) == [("keep", "scheduled"), ("other", "scheduled")]


def test_internal_reminder_api_without_an_owner(db: Any, settings: Any) -> None:
    response = internal(None).get("/internal/reminders/")
    assert response.status_code == HTTP_STATUS.get("no_owner", 400) and response.json()["error"]["code"] == "no_owner"
