"""Model drafts (llm.role_drafts): made in the console or by Yimi through the
model_settings pack, probed once, effective only when one of the owner's devices confirms
them with a signature — and then from the next run only."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from brain.agent_loop import execute_agent_task
from brain.models import Run
from brain.runner import execute_run
from brain.services import accept_utterance
from capabilities.contract import run_contract
from capabilities.manifest import load_pack
from devices.simulator import draft_confirm_message as sim_message
from devices.simulator import draft_digest as sim_digest
from llm import keyring, role_drafts, roles
from llm.fake_server import FakeBrainServer, Rule
from llm.models import ModelRole, ModelRoleDraft
from tests.conftest import (
    MID_RUN_RULES,
    CallbackScript,
    db_async,
    internal_client,
    new_client_id,
    open_socket,
    pack_capability,
    receive_until,
    use_brain,
)
from yimi_project.errors import YimiError

KEY = "sk-draft-5e0c7a19b2d84f6e9a31"
PACK = Path(__file__).resolve().parents[2] / "packs" / "model_settings"
DEAD_URL = "http://127.0.0.1:9/v1"  # the discard port: nothing listens


@pytest.fixture
def keys(tmp_path: Path, settings: Any) -> Path:
    settings.DATA_DIR = tmp_path / "data"
    settings.SECRETS_DIR = tmp_path / "secrets"
    settings.DATA_DIR.mkdir()
    settings.SECRETS_DIR.mkdir()
    assert keyring.ensure_master_key() is True
    return keyring.master_key_path()


def signed(sim: Any, draft: ModelRoleDraft, *, issued_at: int | None = None, nonce: str | None = None, unlocked: bool = True,
           digest: str | None = None, sign_with: Any = None) -> role_drafts.SignedDraftConfirm:
    """What the phone sends, built as the simulator builds it (its own digest and message)."""
    shown = role_drafts.serialize_draft(draft)
    digest = digest or sim_digest(json.loads(json.dumps(shown)))
    issued = int(time.time()) if issued_at is None else issued_at
    nonce = nonce or uuid.uuid4().hex
    message = sim_message(str(sim.device.id), str(draft.id), digest, issued, nonce, "face_id")
    return role_drafts.SignedDraftConfirm(str(sim.device.id), str(draft.id), digest, issued, nonce, (sign_with or sim).sign(message),
                                          unlocked, "face_id")


def new_draft(**overrides: Any) -> ModelRoleDraft:
    fields = {"provider": "deepseek", "base_url": DEAD_URL, "model": "deepseek-chat", "options": {"timeout_seconds": 30},
              "created_by": "owner_console"}
    fields.update(overrides)
    role = fields.pop("role", "brain")
    draft, _ = role_drafts.create_draft(role, **fields)
    return role_drafts.probe_draft(draft.id)


def brain_state() -> tuple[Any, ...]:
    row = ModelRole.objects.get(role="brain")
    return (row.version, row.model, row.base_url, row.api_key_encrypted)


# --- the digest and message the device signs -----------------------------------------------------


def test_the_device_and_the_platform_compute_the_same_digest_and_message(db: Any, keys: Path) -> None:
    use_brain(DEAD_URL)
    draft = new_draft(api_key=KEY, options={"thinking_field": "enable_thinking", "max_tokens": 512})
    shown = json.loads(json.dumps(role_drafts.serialize_draft(draft)))  # as the device receives it
    assert sim_digest(shown) == draft.digest
    assert shown["key"] == "new key" and KEY not in json.dumps(shown)
    assert sim_message("d", str(draft.id), draft.digest, 1, "n" * 16, "face_id") == role_drafts.draft_confirm_message(
        "d", str(draft.id), draft.digest, 1, "n" * 16, "face_id")
    # the sealed key opens only as this draft's
    assert draft.api_key_encrypted and KEY not in draft.api_key_encrypted
    assert role_drafts.probe_key(draft) == KEY


# --- confirmation: who, when, what -------------------------------------------------------------------


def test_a_forged_guest_foreign_expired_or_locked_confirmation_changes_nothing(db: Any, keys: Path, make_device: Any, django_user_model: Any) -> None:
    use_brain(DEAD_URL)
    sim, other, guest = make_device(), make_device(), make_device(guest=True)
    from accounts.models import Device
    from tests.conftest import SimDevice, new_keypair

    stranger = django_user_model.objects.create_user("second", password="x" * 12, is_staff=True, is_superuser=True)
    key, public = new_keypair()  # a non-guest device on another account (as test_owner_boundary makes one)
    foreign = SimDevice(Device.objects.create(owner=stranger, name="their phone", kind="phone", capture_channels=["phone_app"],
                                              public_key=public), key)
    draft = new_draft(api_key=KEY)
    before = brain_state()
    attempts = {
        "bad_signature": signed(sim, draft, sign_with=other),
        "forbidden": signed(guest, draft),
        "forbidden_foreign": signed(foreign, draft),
        "confirm_expired": signed(sim, draft, issued_at=int(time.time()) - 301),
        "confirm_expired_future": signed(sim, draft, issued_at=int(time.time()) + 301),
        "not_unlocked": signed(sim, draft, unlocked=False),
        "digest_mismatch": signed(sim, draft, digest="0" * 64),
    }
    for expected, attempt in attempts.items():
        with pytest.raises(YimiError) as err:
            role_drafts.confirm_draft(attempt)
        assert err.value.code == expected.removesuffix("_foreign").removesuffix("_future"), expected
    assert brain_state() == before
    draft.refresh_from_db()
    assert draft.state == "open" and draft.confirm_nonce is None
    confirmed = role_drafts.confirm_draft(signed(sim, draft))
    assert confirmed.state == "confirmed" and confirmed.attestation == {"unlocked": True, "method": "face_id"}
    assert confirmed.confirmed_device_id == sim.device.id and confirmed.confirm_message.startswith("yimi-model-draft-v1\n")
    now = roles.resolve("brain")
    assert (now.model, now.api_key, now.source, now.version) == ("deepseek-chat", KEY, "draft", before[0] + 1)


def test_a_replayed_confirmation_is_refused(db: Any, keys: Path, make_device: Any) -> None:
    use_brain(DEAD_URL)
    sim = make_device()
    draft = new_draft()
    confirm = signed(sim, draft)
    role_drafts.confirm_draft(confirm)
    version = roles.resolve("brain").version
    with pytest.raises(YimiError) as err:
        role_drafts.confirm_draft(confirm)
    assert err.value.code == "confirm_replayed"
    # the same nonce signed again for another draft is refused as well
    second = new_draft(model="deepseek-reasoner")
    with pytest.raises(YimiError) as err:
        role_drafts.confirm_draft(signed(sim, second, nonce=confirm.nonce))
    assert err.value.code == "confirm_replayed"
    assert roles.resolve("brain").version == version


def test_a_draft_made_against_an_older_revision_is_stale_on_confirm(db: Any, keys: Path, make_device: Any) -> None:
    use_brain(DEAD_URL)
    sim = make_device()
    draft = new_draft(model="model-a")
    roles.apply("brain", provider="demo", base_url=DEAD_URL, model="changed-meanwhile", options={}, source="console")
    version = roles.resolve("brain").version
    with pytest.raises(YimiError) as err:
        role_drafts.confirm_draft(signed(sim, draft))
    assert err.value.code == "draft_stale"
    draft.refresh_from_db()
    assert draft.state == "stale" and roles.resolve("brain").model == "changed-meanwhile" and roles.resolve("brain").version == version
    with pytest.raises(YimiError) as err:
        role_drafts.confirm_draft(signed(sim, draft))
    assert err.value.code == "draft_closed"
    # a discarded draft cannot be confirmed either
    other = new_draft(model="model-b")
    role_drafts.discard_draft(other.id)
    with pytest.raises(YimiError) as err:
        role_drafts.confirm_draft(signed(sim, other))
    assert err.value.code == "draft_closed"


def test_an_unprobed_draft_is_not_offered_and_cannot_be_confirmed(db: Any, keys: Path, make_device: Any) -> None:
    use_brain(DEAD_URL)
    sim = make_device()
    draft, _ = role_drafts.create_draft("brain", provider="p", base_url=DEAD_URL, model="m", options={}, created_by="yimi")
    assert draft.probe_status == "pending" and draft not in role_drafts.offered_drafts()
    with pytest.raises(YimiError) as err:
        role_drafts.confirm_draft(signed(sim, draft))
    assert err.value.code == "draft_not_probed"
    tts, _ = role_drafts.create_draft("tts", provider="p", base_url=DEAD_URL, model="voice", options={}, created_by="owner_console")
    assert tts.probe_status == "unsupported" and "probe not supported for this role" in tts.probe_message
    assert tts in role_drafts.offered_drafts()


# --- the probe --------------------------------------------------------------------------------------------


def test_the_probe_asks_the_endpoint_once_with_max_tokens_1(db: Any, keys: Path, brain: FakeBrainServer) -> None:
    draft = new_draft(base_url=brain.base_url, model="probe-model", api_key=KEY)
    assert (draft.probe_status, draft.probe_http_status, draft.probe_error_code) == ("ok", 200, "")
    assert draft.probe_latency_ms is not None and draft.probed_at is not None
    asked = brain.script.requests[-1]
    assert (asked["model"], asked["max_tokens"], asked["stream"]) == ("probe-model", 1, False)
    brain.script.rules.append(Rule(status=401))
    failed = role_drafts.probe_draft(draft.id)
    assert (failed.probe_status, failed.probe_error_code, failed.probe_http_status) == ("failed", "unauthorized", 401)


# --- a draft confirmed mid-run waits for the next run ------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_a_draft_confirmed_mid_run_takes_effect_for_the_next_run_only(keys: Path, make_device: Any, settings: Any, tmp_path: Path) -> None:
    settings.YIMI_PACKS_DIR = tmp_path / "no-packs"
    settings.YIMI_PACKS_DIR.mkdir()
    holder: dict[str, Any] = {}

    def confirm_on_the_phone(number: int) -> None:
        if number == 2:  # the sub-agent's first request: the run is under way
            try:
                holder["confirmed"] = role_drafts.confirm_draft(signed(holder["sim"], holder["draft"]))
            finally:
                connection.close()  # this handler thread's own connection

    server = FakeBrainServer(script=CallbackScript(MID_RUN_RULES, confirm_on_the_phone))
    server.start_in_thread()
    try:
        await db_async(use_brain)(server.base_url, timeout_seconds=10.0)
        holder["sim"] = sim = await db_async(make_device)()
        holder["draft"] = await db_async(new_draft)(provider="demo", base_url=server.base_url, model="model-from-draft",
                                                    options={"timeout_seconds": 10.0})
        probes = len(server.script.requests)  # the probe's request (model-from-draft, max_tokens 1)
        server.script.requests.clear()
        assert probes == 1
        first = await db_async(accept_utterance)(sim.device, new_client_id(), "hello")
        assert await execute_run(first.run_id) == "succeeded"  # request 1: the main turn
        from brain import agents

        task = await db_async(agents.delegate)(first.run_id, "errand")
        assert await execute_agent_task(task.id) == "succeeded"  # requests 2, 3 (sub-agent), 4 (report)
        assert holder["confirmed"].state == "confirmed"
        models = [r["model"] for r in server.script.requests]
        assert models == ["yimi-demo"] * 4, models  # confirmed during request 2, yet the run kept its model
        second = await db_async(accept_utterance)(sim.device, new_client_id(), "hello again")
        assert await execute_run(second.run_id) == "succeeded"
        assert server.script.requests[-1]["model"] == "model-from-draft"  # the next run
        pins = await db_async(lambda: dict(Run.objects.values_list("id", "model_roles")))()
        assert pins[second.run_id]["brain"]["version"] == holder["confirmed"].applied_version
    finally:
        server.shutdown()
        server.server_close()


# --- the device frames ---------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_a_device_lists_drafts_and_confirms_one_with_a_signed_frame(keys: Path, make_device: Any) -> None:
    await db_async(use_brain)(DEAD_URL)
    sim, guest = await db_async(make_device)(), await db_async(make_device)(guest=True)
    draft = await db_async(new_draft)(api_key=KEY)
    comm, _ = await open_socket(sim)
    await comm.send_json_to({"type": "model.drafts", "id": "l"})
    listing = await receive_until(comm, "model.drafts")
    (shown,) = listing["drafts"]
    assert shown["id"] == str(draft.id) and shown["key"] == "new key" and KEY not in json.dumps(listing)
    assert shown["probe"]["status"] == "failed" and shown["probe"]["error_code"] == "unreachable"
    confirm = await db_async(signed)(sim, draft)
    frame = {"type": "model.draft.confirm", "id": "c", "draft_id": str(draft.id), "digest": confirm.digest,
             "issued_at": confirm.issued_at, "nonce": confirm.nonce, "attestation": {"unlocked": True, "method": "face_id"}}
    await comm.send_json_to({**frame, "signature": sim.sign(b"not the confirmation")})
    assert (await receive_until(comm, "error"))["code"] == "bad_signature"
    await comm.send_json_to({**frame, "signature": confirm.signature})
    done = await receive_until(comm, "model.draft.confirm.ok")
    assert (done["draft_id"], done["state"], done["role"]) == (str(draft.id), "confirmed", "brain") and KEY not in json.dumps(done)
    await comm.send_json_to({**frame, "signature": confirm.signature})
    assert (await receive_until(comm, "error"))["code"] == "confirm_replayed"
    await comm.disconnect()
    gcomm, _ = await open_socket(guest)
    await gcomm.send_json_to({"type": "model.drafts", "id": "g"})
    assert (await receive_until(gcomm, "error"))["code"] == "forbidden"
    await gcomm.disconnect()


# --- the pack: it drafts, it never applies -----------------------------------------------------------------


def test_the_pack_declares_read_and_draft_only(db: Any) -> None:
    pack = load_pack(PACK)
    assert sorted(pack.tools) == ["draft", "read"] and pack.platform_api == ["model_settings"]
    assert pack.tools["read"].resolve_category({}) == "observe" and pack.tools["draft"].resolve_category({}) == "owner_data"


def test_the_pack_can_draft_but_not_apply(db: Any, keys: Path, owner: Any, make_device: Any) -> None:
    use_brain(DEAD_URL)
    before = brain_state()

    def client(category: str, **target: Any) -> Any:
        cap = pack_capability(owner.pk, pack="model_settings", category=category, apis=["model_settings"], **target)
        return internal_client(**{"X-Yimi-Call-Capability": cap})

    body = {"role": "brain", "model": "yimi-picked", "note": "the owner asked for a cheaper model", "idempotency_key": "k1"}
    observe = client("observe")
    refused = observe.post("/internal/model-settings/drafts/", body, content_type="application/json")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    wrong_role = client("owner_data", role="vision").post("/internal/model-settings/drafts/", body, content_type="application/json")
    assert wrong_role.status_code == 403
    with_key = client("owner_data", role="brain").post("/internal/model-settings/drafts/", {**body, "api_key": KEY}, content_type="application/json")
    assert with_key.status_code == 400 and with_key.json()["error"]["code"] == "invalid_request"
    # another pack's capability does not reach these endpoints
    memory_cap = pack_capability(owner.pk, pack="memory", category="owner_data", apis=["memory"], role="brain")
    assert internal_client(**{"X-Yimi-Call-Capability": memory_cap}).get("/internal/model-settings/").status_code == 403
    made = client("owner_data", role="brain").post("/internal/model-settings/drafts/", body, content_type="application/json")
    assert made.status_code == 201, made.content
    draft = made.json()["draft"]
    assert (draft["created_by"], draft["state"], draft["model"], draft["base_url"], draft["key"]) == ("yimi", "open", "yimi-picked", DEAD_URL, "unchanged")
    # no path applies it: not the internal API, whatever the capability
    for path in (f"/internal/model-settings/drafts/{draft['id']}/confirm/", f"/internal/model-settings/drafts/{draft['id']}/apply/",
                 "/internal/model-settings/apply/"):
        assert client("owner_data", role="brain").post(path, {}, content_type="application/json").status_code == 404
    read = observe.get("/internal/model-settings/")
    assert read.status_code == 200 and read.json()["open_drafts"][0]["id"] == draft["id"]
    assert {r["role"]: r["model"] for r in read.json()["roles"]}["brain"] == "yimi-demo"
    assert brain_state() == before
    stored = ModelRoleDraft.objects.get(id=draft["id"])
    assert stored.state == "open"
    # ... until the owner's device confirms it
    role_drafts.probe_draft(stored.id)
    role_drafts.confirm_draft(signed(make_device(), stored))
    assert roles.resolve("brain").model == "yimi-picked"


def test_the_pack_contract_passes_on_the_fake() -> None:
    report = run_contract(PACK, fake=True)
    assert report.passed, [(c.name, c.failures) for c in report.cases] + report.errors
    assert report.skipped == ["an unreachable platform is DISCONNECTED, never a success"]


@pytest.mark.django_db(transaction=True)
def test_the_pack_contract_passes_on_the_real_server_against_the_platform(internal_listener: Any, keys: Path, owner: Any) -> None:
    use_brain(DEAD_URL)
    before = brain_state()
    report = run_contract(PACK, fake=False, owner_id=owner.pk)
    assert report.passed, [(c.name, c.failures) for c in report.cases] + report.errors
    assert len(report.cases) == 4 and not report.skipped
    drafts = ModelRoleDraft.objects.all()
    assert drafts.count() == 2 and {d.state for d in drafts} == {"open"} and {d.created_by for d in drafts} == {"yimi"}
    assert brain_state() == before and not ModelRole.objects.filter(role="vision").exists()


# --- the console ------------------------------------------------------------------------------------------------


def console(owner: Any) -> Client:
    client = Client()
    client.force_login(owner)
    return client


def test_a_failing_probe_is_shown_on_the_draft_page_and_can_still_be_confirmed(db: Any, keys: Path, owner: Any, make_device: Any) -> None:
    use_brain(DEAD_URL)
    client = console(owner)
    made = client.post("/admin/llm/modelroledraft/", {
        "action": "create", "role": "brain", "provider": "deepseek", "base_url": DEAD_URL, "model": "deepseek-chat",
        "timeout_seconds": "30", "include_usage": "on", "api_key": KEY, "note": "try deepseek",
    })
    assert made.status_code == 302
    draft = ModelRoleDraft.objects.get()
    page = client.get(made["Location"]).content.decode()
    assert "failed: unreachable" in page and "You can still confirm this draft on a device" in page
    assert draft.digest in page and "yimi-model-draft-v1" in page and "unlocked" in page and "new key" in page
    role_drafts.confirm_draft(signed(make_device(), draft))
    draft.refresh_from_db()
    assert draft.state == "confirmed" and roles.resolve("brain").model == "deepseek-chat"
    assert "confirmed" in client.get(made["Location"]).content.decode()


def test_the_console_refuses_bad_input_keeps_the_form_and_never_renders_the_key(db: Any, keys: Path, owner: Any) -> None:
    use_brain(DEAD_URL)
    client = console(owner)
    page = client.post("/admin/llm/modelroledraft/", {
        "action": "create", "role": "brain", "provider": "p", "base_url": "ftp://nope", "model": "kept-model", "api_key": KEY,
    })
    text = page.content.decode()
    assert page.status_code == 200 and "invalid_model_settings" in text and "kept-model" in text and KEY not in text
    assert ModelRoleDraft.objects.count() == 0
    other = Client()
    from django.contrib.auth import get_user_model

    other.force_login(get_user_model().objects.create_user("staff", password="x" * 12, is_staff=True, is_superuser=True))
    assert other.get("/admin/llm/modelroledraft/").status_code == 403


def test_the_key_is_never_in_any_page_or_response(db: Any, keys: Path, owner: Any, caplog: Any) -> None:
    use_brain(DEAD_URL)
    client = console(owner)
    made = client.post("/admin/llm/modelroledraft/", {"action": "create", "role": "vision", "provider": "sf", "base_url": DEAD_URL,
                                                        "model": "glm", "api_key": KEY})
    draft = ModelRoleDraft.objects.get()
    cap = pack_capability(owner.pk, pack="model_settings", category="observe", apis=["model_settings"])
    outputs = [
        client.get(made["Location"]).content.decode(),
        client.get("/admin/llm/modelroledraft/").content.decode(),
        client.get("/admin/llm/modelrole/").content.decode(),
        internal_client(**{"X-Yimi-Call-Capability": cap}).get("/internal/model-settings/").content.decode(),
        json.dumps(role_drafts.serialize_draft(draft)),
        json.dumps(role_drafts.read_settings()),
        str(draft), draft.digest, role_drafts.canonical_contents(draft.role, draft.provider, draft.base_url, draft.model, draft.options, draft.key_change),
        draft.api_key_encrypted or "",
        caplog.text,
    ]
    for text in outputs:
        assert KEY not in text
    assert 'type="password" name="api_key" value=""' in outputs[0]


# --- the probe never carries a stored key to another host --------------------------------------


@pytest.mark.django_db
def test_a_draft_for_another_host_is_probed_without_the_roles_stored_key(keys: Path) -> None:
    roles.import_from_environment({})
    roles.apply("brain", provider="p", base_url="https://api.provider.example/v1", model="m", options={}, api_key=KEY, source="console")
    elsewhere, _ = role_drafts.create_draft(
        "brain", provider="p", base_url="https://collector.example/v1", model="m", options={}, created_by="yimi",
    )
    same_host, _ = role_drafts.create_draft(
        "brain", provider="p", base_url="https://api.provider.example/v1/", model="m2", options={}, created_by="yimi",
    )
    assert role_drafts.probe_key(elsewhere) is None
    assert role_drafts.probe_key(same_host) == KEY
