"""The owner's Mac through its paired device (devices/mac/relay.py, packs/owner-mac).

Operations go from the pack's internal endpoint (a real Unix socket, a pack capability)
through the channel layer to a Mac connected on a real ``/ws/device/`` socket, sealed to
its X25519 key; the simulated Mac (devices/mac/sim.py) executes them inside a sandbox
directory and answers signed, sealed results.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import call_command

from accounts.signatures import auth_message
from capabilities import packkit
from capabilities.manifest import load_pack
from devices.mac import crypto as mac_crypto
from devices.mac.models import MacKey, MacOperation, MacPause
from devices.mac.sandbox import MacSandbox
from devices.mac.sim import MacAgent
from tests.conftest import db_async, open_socket, pack_capability, receive_until
from tests.memory.test_memory_forgetting import places_holding

PACK = Path(__file__).resolve().parents[2] / "packs" / "owner-mac"
SECRET_TEXT = "the owner's secret diary: 今天很开心 7f3a9c"


# --- the simulated Mac on a real socket ---------------------------------------------------------


class OnlineMac:
    """A Mac connected on /ws/device/ that registered its key and answers every op."""

    def __init__(self, comm: Any, agent: MacAgent, nonce: str) -> None:
        self.comm, self.agent, self.nonce = comm, agent, nonce
        self.frames: list[dict[str, Any]] = []
        self.tamper: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None
        self.task: asyncio.Task[None] | None = None

    async def serve(self) -> None:
        while True:
            frame = await self.comm.receive_json_from(timeout=3600)
            self.frames.append(frame)
            if frame["type"] == "mac.op":
                result = self.agent.handle_op(frame)
                assert result is not None
                for out in self.tamper(result) if self.tamper else [result]:
                    await self.comm.send_json_to(out)
            else:
                self.agent.note(frame)

    async def wait_for(self, kind: str, **fields: Any) -> dict[str, Any]:
        for _ in range(200):
            for frame in self.frames:
                if frame["type"] == kind and all(frame.get(k) == v for k, v in fields.items()):
                    return frame
            await asyncio.sleep(0.05)
        raise AssertionError(f"no {kind} {fields} in {self.frames}")


async def open_device(sim: Any) -> Any:
    """/ws/device/ authenticated as ``sim``, keeping the challenge nonce (``yimi_nonce``) that
    connection-bound signatures sign."""
    comm, challenge = await open_socket(sim, authenticate=False)
    await comm.send_json_to({"type": "auth", "device_id": str(sim.device.id),
                             "signature": sim.sign(auth_message(challenge["nonce"], str(sim.device.id)))})
    assert (await comm.receive_json_from())["type"] == "ready"
    comm.yimi_nonce = challenge["nonce"]
    return comm


async def connect_mac(sim: Any, sandbox: Path) -> OnlineMac:
    from accounts.identity import instance_public_key_b64

    comm = await open_device(sim)
    agent = MacAgent(str(sim.device.id), sim.key, await db_async(instance_public_key_b64)(), MacSandbox(sandbox))
    await comm.send_json_to(agent.hello_frame())
    hello = await receive_until(comm, "mac.hello.ok", "error")
    assert hello["type"] == "mac.hello.ok", hello
    agent.note(hello)
    mac = OnlineMac(comm, agent, "")
    mac.task = asyncio.ensure_future(mac.serve())
    return mac


@pytest.fixture
async def online_mac(make_device: Any, internal_listener_on_loop: Path, tmp_path: Path) -> AsyncIterator[OnlineMac]:
    sim = await db_async(make_device)("mac")
    mac = await connect_mac(sim, tmp_path / "sandbox")
    mac.sim = sim  # type: ignore[attr-defined]
    try:
        yield mac
    finally:
        assert mac.task is not None
        mac.task.cancel()
        await asyncio.gather(mac.task, return_exceptions=True)
        await mac.comm.disconnect()


async def op(owner_id: int, tool: str, kind: str, payload: dict[str, Any], *, category: str | None = None, **target: Any) -> tuple[int, Any]:
    """One call of the pack's endpoint over the internal Unix socket, as the pack makes it."""
    category = category or ("owner_data" if kind in ("write_file", "run_command", "operate_app") else "observe")
    cap = pack_capability(owner_id, pack="owner-mac", category=category, apis=["mac"], tool=f"owner-mac__{tool}", **target)

    def call() -> tuple[int, Any]:
        return packkit.run_with_capability(lambda _a: packkit.platform_call("POST", "mac/op/", {"kind": kind, "payload": payload}, timeout=60), {}, cap)

    return await asyncio.to_thread(call)


@pytest.fixture(autouse=True)
def _platform_socket(settings: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("YIMI_PLATFORM_SOCKET", str(settings.YIMI_INTERNAL_SOCKET))


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# --- the relay ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_an_op_round_trip_writes_reads_and_lists_inside_the_sandbox_and_no_table_holds_the_content(
    online_mac: OnlineMac, owner: Any, tmp_path: Path
) -> None:
    status, body = await op(owner.pk, "write_file", "write_file", {"path": "notes/diary.txt", "content_b64": b64(SECRET_TEXT)}, path="notes/diary.txt")
    assert status == 200, body
    assert body["result"]["status"] == "ok" and body["result"]["created"] is True
    assert (tmp_path / "sandbox" / "notes" / "diary.txt").read_text() == SECRET_TEXT

    status, body = await op(owner.pk, "read_file", "read_file", {"path": "notes/diary.txt"}, path="notes/diary.txt")
    assert status == 200 and base64.b64decode(body["result"]["content_b64"]).decode() == SECRET_TEXT
    status, body = await op(owner.pk, "list_dir", "list_dir", {"path": "notes"}, path="notes")
    assert status == 200 and [e["name"] for e in body["result"]["entries"]] == ["diary.txt"]

    # the op frames the Mac received carried only ciphertext
    ops = [f for f in online_mac.frames if f["type"] == "mac.op"]
    assert len(ops) == 3 and all(SECRET_TEXT not in str(f) and b64(SECRET_TEXT) not in str(f) for f in ops)
    # the command log: kind, target, outcome, size, digest -- never the content
    rows = await db_async(lambda: list(MacOperation.objects.order_by("requested_at").values_list("kind", "target", "outcome", "size_bytes", "sha256")))()
    digest = mac_crypto.hashlib.sha256(SECRET_TEXT.encode()).hexdigest()
    size = len(SECRET_TEXT.encode())
    assert rows == [
        ("write_file", "notes/diary.txt", "ok", size, digest),
        ("read_file", "notes/diary.txt", "ok", size, digest),
        ("list_dir", "notes", "ok", None, ""),
    ]
    assert await db_async(places_holding)(SECRET_TEXT, b64(SECRET_TEXT), "今天很开心") == []


@pytest.mark.django_db(transaction=True)
async def test_paused_from_the_phone_refuses_every_operation_until_resumed(online_mac: OnlineMac, owner: Any, make_device: Any) -> None:
    phone = await db_async(make_device)("phone")
    comm = await open_device(phone)
    try:
        await pause(comm, phone, True)
        assert (await online_mac.wait_for("mac.paused", paused=True))["by_device"] == str(phone.device.id)
        for tool, payload, target in (
            ("read_file", {"path": "a.txt"}, {"path": "a.txt"}),
            ("write_file", {"path": "a.txt", "content_b64": b64("x")}, {"path": "a.txt"}),
            ("run_command", {"argv": ["echo", "hi"]}, {}),
        ):
            status, body = await op(owner.pk, tool, tool, payload, **target)
            assert (status, body["error"]["code"]) == (409, "paused")
        assert online_mac.agent.executed == []
        assert await db_async(lambda: list(MacOperation.objects.values_list("outcome", flat=True)))() == ["paused"] * 3

        await pause(comm, phone, False)
        status, body = await op(owner.pk, "run_command", "run_command", {"argv": ["echo", "hi"]})
        assert status == 200 and body["result"]["stdout"] == "hi\n" and body["result"]["exit_code"] == 0
    finally:
        await comm.disconnect()


async def pause(comm: Any, sim: Any, paused: bool, *, nonce: str | None = None) -> dict[str, Any]:
    nonce = nonce if nonce is not None else comm.yimi_nonce
    await comm.send_json_to({"type": "mac.pause", "id": "p1", "paused": paused,
                             "signature": sim.sign(mac_crypto.pause_message(str(sim.device.id), nonce, paused))})
    answer = await receive_until(comm, "mac.pause.ok", "error")
    assert answer["type"] == "mac.pause.ok", answer
    assert answer["paused"] is paused
    return answer


@pytest.mark.django_db(transaction=True)
async def test_the_macs_hotkey_pauses_it_too(online_mac: OnlineMac, owner: Any) -> None:
    frame = online_mac.agent.pause_frame(True, online_mac.comm.yimi_nonce)
    await online_mac.comm.send_json_to(frame)
    await online_mac.wait_for("mac.pause.ok", paused=True)
    assert await db_async(lambda: MacPause.objects.get(owner=owner).changed_by_id)() == online_mac.sim.device.id  # type: ignore[attr-defined]
    status, body = await op(owner.pk, "screenshot", "screenshot", {})
    assert (status, body["error"]["code"]) == (409, "paused")
    assert online_mac.agent.executed == []


@pytest.mark.django_db(transaction=True)
async def test_a_guest_device_cannot_pause_and_an_unsigned_pause_changes_nothing(make_device: Any, owner: Any) -> None:
    guest = await db_async(make_device)("phone", guest=True)
    comm = await open_device(guest)
    await comm.send_json_to({"type": "mac.pause", "id": "g", "paused": True,
                             "signature": guest.sign(mac_crypto.pause_message(str(guest.device.id), comm.yimi_nonce, True))})
    assert (await receive_until(comm, "error"))["code"] == "forbidden"
    await comm.disconnect()
    phone = await db_async(make_device)("phone")
    comm = await open_device(phone)
    await comm.send_json_to({"type": "mac.pause", "id": "f", "paused": True,
                             "signature": phone.sign(mac_crypto.pause_message(str(phone.device.id), "another-nonce", True))})
    assert (await receive_until(comm, "error"))["code"] == "bad_signature"
    await comm.disconnect()
    assert not await db_async(MacPause.objects.exists)()


@pytest.mark.django_db(transaction=True)
async def test_a_result_with_a_forged_signature_is_refused_and_the_genuine_one_still_counts(online_mac: OnlineMac, owner: Any) -> None:
    forger = Ed25519PrivateKey.generate()

    def forge_first(result: dict[str, Any]) -> list[dict[str, Any]]:
        message = mac_crypto.result_message(str(online_mac.sim.device.id), result["op_id"], result["status"],  # type: ignore[attr-defined]
                                            result["nonce"], result["ciphertext"])
        forged = {**result, "signature": base64.b64encode(forger.sign(message)).decode()}
        return [forged, result]

    online_mac.tamper = forge_first
    status, body = await op(owner.pk, "list_dir", "list_dir", {"path": "."}, path=".")
    assert status == 200 and body["result"]["status"] == "ok"
    assert (await online_mac.wait_for("error"))["code"] == "bad_signature"
    # a result for an op this socket never delivered is refused too
    await online_mac.comm.send_json_to({**online_mac.agent.result_frame(
        "00000000-0000-4000-8000-000000000000", "list_dir", {"status": "ok"}, mac_crypto.platform_keys(
            mac_crypto.x25519_public_b64(online_mac.agent.x25519), "x")), "op_id": "00000000-0000-4000-8000-000000000000"})
    await online_mac.wait_for("error", code="unknown_op")


@pytest.mark.django_db(transaction=True)
async def test_no_connected_mac_is_mac_offline(make_device: Any, owner: Any, internal_listener_on_loop: Path, tmp_path: Path, settings: Any) -> None:
    settings.MAC_OP_ACCEPT_SECONDS = 0.5  # nobody will take it: how long to wait does not change the answer
    status, body = await op(owner.pk, "list_dir", "list_dir", {"path": "."}, path=".")
    assert (status, body["error"]["code"]) == (503, "mac_offline")  # no Mac registered a key
    sim = await db_async(make_device)("mac")
    mac = await connect_mac(sim, tmp_path / "sandbox")
    assert mac.task is not None
    mac.task.cancel()
    await mac.comm.disconnect()
    assert await db_async(MacKey.objects.filter(device=sim.device).exists)()
    status, body = await op(owner.pk, "list_dir", "list_dir", {"path": "."}, path=".")
    assert (status, body["error"]["code"]) == (503, "mac_offline")  # registered, not connected
    outcomes = await db_async(lambda: list(MacOperation.objects.order_by("requested_at").values_list("outcome", flat=True)))()
    assert outcomes == ["mac_offline", "mac_offline"]


@pytest.mark.django_db(transaction=True)
async def test_the_capability_allows_only_its_own_operation_category_and_target(owner: Any, internal_listener_on_loop: Path) -> None:
    write = {"path": "a.txt", "content_b64": b64("x")}
    # a read call cannot write; a write decided as observe cannot write; another path is refused
    assert (await op(owner.pk, "read_file", "write_file", write, path="a.txt"))[1]["error"]["code"] == "forbidden"
    assert (await op(owner.pk, "write_file", "write_file", write, category="observe", path="a.txt"))[1]["error"]["code"] == "forbidden"
    assert (await op(owner.pk, "write_file", "write_file", write, path="b.txt"))[1]["error"]["code"] == "forbidden"
    # a command is bound to the argv the call was decided on, not only to paths and apps
    run = {"argv": ["rm", "-rf", "notes"]}
    assert (await op(owner.pk, "run_command", "run_command", run, argv=str(["ls", "notes"])))[1]["error"]["code"] == "forbidden"
    cap = pack_capability(owner.pk, pack="memory", category="observe", apis=["memory"], tool="owner-mac__read_file")
    status, _ = await asyncio.to_thread(packkit.run_with_capability, lambda _a: packkit.platform_call(
        "POST", "mac/op/", {"kind": "read_file", "payload": {"path": "a.txt"}}), {}, cap)
    assert status == 403  # the pack did not declare the mac API
    assert not await db_async(MacOperation.objects.exists)()


def test_the_sandbox_refuses_paths_and_links_that_leave_it(tmp_path: Path) -> None:
    root = tmp_path / "box"
    box = MacSandbox(root)
    (tmp_path / "outside.txt").write_text("no")
    os.symlink(tmp_path / "outside.txt", root / "link.txt")
    for path in ("../outside.txt", "/etc/passwd", "link.txt", "a/../../outside.txt", "~/x"):
        assert box.execute("read_file", {"path": path})["code"] == "path_outside_sandbox", path
    assert box.execute("run_command", {"argv": ["cat", "../outside.txt"]})["code"] == "path_outside_sandbox"
    assert box.execute("run_command", {"argv": ["rm", "x"]})["code"] == "command_not_allowed"
    assert box.execute("write_file", {"path": "../escape.txt", "content_b64": b64("x")})["code"] == "path_outside_sandbox"
    assert not (tmp_path / "escape.txt").exists()


def test_an_op_sealed_for_one_mac_does_not_open_for_another() -> None:
    mac_a = mac_crypto.derive_x25519(Ed25519PrivateKey.generate())
    mac_b = mac_crypto.derive_x25519(Ed25519PrivateKey.generate())
    keys = mac_crypto.platform_keys(mac_crypto.x25519_public_b64(mac_a), "op-1")
    nonce, ct = mac_crypto.seal(keys.op_key, {"kind": "read_file", "path": "x"}, mac_crypto.associated_data("op-1", "read_file"))
    assert mac_crypto.open_sealed(mac_crypto.mac_keys(mac_a, keys.epk, "op-1").op_key, nonce, ct, mac_crypto.associated_data("op-1", "read_file"))["path"] == "x"
    with pytest.raises(mac_crypto.SealError):
        mac_crypto.open_sealed(mac_crypto.mac_keys(mac_b, keys.epk, "op-1").op_key, nonce, ct, mac_crypto.associated_data("op-1", "read_file"))
    with pytest.raises(mac_crypto.SealError):  # the kind is bound: a read cannot be replayed as a write
        mac_crypto.open_sealed(mac_crypto.mac_keys(mac_a, keys.epk, "op-1").op_key, nonce, ct, mac_crypto.associated_data("op-1", "write_file"))


# --- the pack -----------------------------------------------------------------------------------


def test_the_owner_mac_manifest_reads_observe_writes_owner_data_and_ships_off() -> None:
    pack = load_pack(PACK)
    assert sorted(pack.tools) == ["list_dir", "operate_app", "read_file", "run_command", "screenshot", "write_file"]
    assert {n: t.resolve_category({}) for n, t in pack.tools.items()} == {
        "read_file": "observe", "list_dir": "observe", "screenshot": "observe",
        "write_file": "owner_data", "run_command": "owner_data", "operate_app": "owner_data",
    }
    assert pack.platform_api == ["mac"] and pack.enabled_by_default is False and pack.host == "dedicated" and pack.scopes == ["owner"]


@pytest.mark.django_db(transaction=True)
async def test_pack_contract_owner_mac_passes_on_the_real_server_through_a_connected_mac_and_on_the_fake(
    online_mac: OnlineMac, owner: Any
) -> None:
    out = io.StringIO()
    def run() -> None:
        from django.db import connections

        try:
            call_command("pack_contract", "owner-mac", "--both", "--against-live", stdout=out)
        finally:
            connections.close_all()  # this worker thread's connection, so the test database can be dropped

    await asyncio.to_thread(run)
    text = out.getvalue()
    assert "2/2 contract runs passed" in text, text
    rows = [line.split()[:3] for line in text.splitlines()[1:] if line.startswith("owner-mac")]
    assert sorted({tuple(r) for r in rows}) == [("owner-mac", "fake", "pass"), ("owner-mac", "real", "pass")], text
    assert len(online_mac.agent.executed) == 11  # every real step reached the Mac
    assert SECRET_TEXT not in text
