"""The desktop pack (packs/desktop): a desktop assistant on the owner's Mac over the SAME relay
as owner-mac (devices/mac/relay.py), with the simulated Mac's desktop (devices/mac/desktop.py).

Every tool's operation goes from the pack's internal endpoint (a real Unix socket, a pack
capability as the gateway mints it) through the channel layer to a Mac connected on a real
``/ws/device/`` socket, sealed to its X25519 key; the simulated Mac executes it on its
simulated desktop and answers a signed, sealed result.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from brain.services import accept_utterance
from capabilities import packkit
from capabilities.manifest import load_pack
from devices.mac import relay as mac_relay
from devices.mac.desktop import DESKTOP_KINDS, DESKTOP_READ_KINDS, DESKTOP_STATE, DESKTOP_WRITE_KINDS
from devices.mac.models import MacOperation
from devices.mac.sandbox import MacSandbox
from tests.conftest import db_async, new_client_id, pack_capability
from tests.devices import test_owner_mac
from tests.devices.test_owner_mac import OnlineMac
from tests.memory.test_memory_forgetting import places_holding

online_mac = test_owner_mac.online_mac  # the simulated Mac on a real socket (a fixture)
_platform_socket = test_owner_mac._platform_socket  # autouse: packs reach the internal listener

PACK = Path(__file__).resolve().parents[2] / "packs" / "desktop"
SECRET = "my bank PIN is 4711, 不要告诉别人"


async def desk_op(owner_id: int, tool: str, payload: dict[str, Any], *, kind: str | None = None, category: str | None = None,
                  pack: str = "desktop", **target: Any) -> tuple[int, Any]:
    """One call of the relay's endpoint over the internal Unix socket, as the desktop pack makes it."""
    kind = kind or tool
    category = category or ("observe" if kind in DESKTOP_READ_KINDS else "owner_data")
    cap = pack_capability(owner_id, pack=pack, category=category, apis=["mac"], tool=f"{pack}__{tool}", **target)

    def call() -> tuple[int, Any]:
        return packkit.run_with_capability(lambda _a: packkit.platform_call("POST", "mac/op/", {"kind": kind, "payload": payload}, timeout=60), {}, cap)

    return await asyncio.to_thread(call)


def desktop_state(sandbox: Path) -> dict[str, Any]:
    return json.loads((sandbox / DESKTOP_STATE).read_text())


def front_text_app(box: MacSandbox) -> None:
    assert box.execute("activate_app", {"app": "TextEdit"})["status"] == "ok"


def typed(text: str) -> Callable[[MacSandbox], None]:
    def setup(box: MacSandbox) -> None:
        front_text_app(box)
        assert box.execute("type_text", {"app": "TextEdit", "text": text})["status"] == "ok"
    return setup


def selected(text: str) -> Callable[[MacSandbox], None]:
    def setup(box: MacSandbox) -> None:
        typed(text)(box)
        assert box.execute("press_keys", {"app": "TextEdit", "keys": "cmd+a"})["effect"] == "selected_all"
    return setup


def a_file(path: str, text: str) -> Callable[[MacSandbox], None]:
    def setup(box: MacSandbox) -> None:
        (box.root / path).parent.mkdir(parents=True, exist_ok=True)
        (box.root / path).write_text(text)
    return setup


def nothing(box: MacSandbox) -> None:
    return None


def png_size(result: dict[str, Any], box: Path) -> tuple[int, int]:
    png = base64.b64decode(result["image_b64"])
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


# tool, payload, the call's named target, setup on the Mac before, check of (result, sandbox dir), command log target
CASES: list[tuple[str, dict[str, Any], dict[str, Any], Callable[[MacSandbox], None], Callable[[dict[str, Any], Path], bool], str]] = [
    ("list_windows", {}, {}, front_text_app,
     lambda r, d: r["frontmost_app"] == "TextEdit" and [w["app"] for w in r["windows"]] == ["TextEdit", "Finder"], ""),
    ("read_clipboard", {}, {}, lambda b: b.execute("write_clipboard", {"text": "from the owner"}) and None,
     lambda r, d: r["text"] == "from the owner" and r["size"] == 14, ""),
    ("read_selection", {}, {}, selected("第一行\nsecond line"), lambda r, d: r["text"] == "第一行\nsecond line" and r["app"] == "TextEdit", ""),
    ("capture_region", {"x": 10, "y": 20, "width": 48, "height": 30}, {}, nothing,
     lambda r, d: png_size(r, d) == (48, 30) and r["simulated"] is True, "10,20 48x30"),
    ("read_notifications", {"limit": 5}, {}, nothing, lambda r, d: r["notifications"][0]["app"] == "Yimi" and r["total"] == 1, ""),
    ("find_files", {"name": "report"}, {}, a_file("docs/Q3-Report.txt", "numbers"),
     lambda r, d: r["matches"] == [{"path": "docs/Q3-Report.txt", "kind": "file", "size": 7}], "report in ."),
    ("get_system_state", {}, {}, nothing, lambda r, d: (r["volume"], r["dark_mode"], r["battery_percent"]) == (50, False, 87), ""),
    ("activate_app", {"app": "Notes"}, {"app": "Notes"}, nothing,
     lambda r, d: r["frontmost"] == "Notes" and desktop_state(d)["windows"][0]["app"] == "Notes", "Notes"),
    ("type_text", {"app": "TextEdit", "text": SECRET}, {"app": "TextEdit"}, front_text_app,
     lambda r, d: desktop_state(d)["windows"][0]["text"] == SECRET and r["characters"] == len(SECRET), "TextEdit"),
    ("press_keys", {"app": "TextEdit", "keys": "cmd+w"}, {"app": "TextEdit", "keys": "cmd+w"}, front_text_app,
     lambda r, d: r["effect"] == "closed_window" and [w["app"] for w in desktop_state(d)["windows"]] == ["Finder"], "cmd+w in TextEdit"),
    ("click", {"app": "TextEdit", "element": "zoom"}, {"app": "TextEdit", "element": "zoom"}, front_text_app,
     lambda r, d: desktop_state(d)["windows"][0]["bounds"] == [0, 25, 1440, 875], "TextEdit zoom"),
    ("scroll", {"app": "TextEdit", "dy": 50, "dx": 5}, {"app": "TextEdit"}, front_text_app,
     lambda r, d: (r["scroll_x"], r["scroll_y"]) == (5, 50) and desktop_state(d)["windows"][0]["scroll"] == [5, 50], "TextEdit"),
    ("write_clipboard", {"text": SECRET}, {}, nothing, lambda r, d: desktop_state(d)["clipboard"] == SECRET, ""),
    ("open_url", {"url": "https://example.com/a?b=1"}, {"url": "https://example.com/a?b=1"}, nothing,
     lambda r, d: r["app"] == "Safari" and desktop_state(d)["windows"][0]["title"] == "https://example.com/a?b=1", "https://example.com/a?b=1"),
    ("open_file", {"path": "notes/todo.txt"}, {"path": "notes/todo.txt"}, a_file("notes/todo.txt", "buy milk"),
     lambda r, d: r["app"] == "TextEdit" and desktop_state(d)["windows"][0]["text"] == "buy milk", "notes/todo.txt"),
    ("set_system_state", {"volume": 20, "dark_mode": True}, {"volume": 20, "dark_mode": True}, nothing,
     lambda r, d: r["after"] == {"volume": 20, "dark_mode": True} and desktop_state(d)["dark_mode"] is True, "volume=20 dark_mode=True"),
]


def test_the_cases_cover_every_desktop_tool_once() -> None:
    assert sorted(c[0] for c in CASES) == sorted(DESKTOP_KINDS) == sorted(load_pack(PACK).tools)


@pytest.mark.parametrize("tool,payload,target,setup,check,log_target", CASES, ids=[c[0] for c in CASES])
@pytest.mark.django_db(transaction=True)
async def test_each_desktop_tool_round_trips_through_the_relay_to_the_simulated_mac(
    online_mac: OnlineMac, owner: Any, tmp_path: Path, tool: str, payload: dict[str, Any], target: dict[str, Any],
    setup: Callable[[MacSandbox], None], check: Callable[[dict[str, Any], Path], bool], log_target: str,
) -> None:
    sandbox = tmp_path / "sandbox"
    setup(online_mac.agent.sandbox)  # the owner's own earlier use of the Mac (not through the relay)
    status, body = await desk_op(owner.pk, tool, payload, **target)
    assert status == 200, body
    result = body["result"]
    assert result["status"] == "ok", result
    assert check(result, sandbox), result
    assert [kind for _, kind in online_mac.agent.executed] == [tool]
    # the op frame carried only ciphertext; the command log has the kind and target, never a text typed or copied
    frames = [f for f in online_mac.frames if f["type"] == "mac.op"]
    assert len(frames) == 1 and frames[0]["kind"] == tool and SECRET not in str(frames[0])
    rows = await db_async(lambda: list(MacOperation.objects.values_list("kind", "target", "outcome", "tool")))()
    assert rows == [(tool, log_target, "ok", f"desktop__{tool}")]
    assert await db_async(places_holding)(SECRET) == []


@pytest.mark.django_db(transaction=True)
async def test_paused_refuses_desktop_reads_and_acts_and_the_desktop_is_unchanged(online_mac: OnlineMac, owner: Any, tmp_path: Path) -> None:
    front_text_app(online_mac.agent.sandbox)
    before = (tmp_path / "sandbox" / DESKTOP_STATE).read_text()
    await online_mac.comm.send_json_to(online_mac.agent.pause_frame(True, online_mac.comm.yimi_nonce))
    await online_mac.wait_for("mac.pause.ok", paused=True)
    for tool, payload, target in (
        ("list_windows", {}, {}),
        ("read_clipboard", {}, {}),
        ("type_text", {"app": "TextEdit", "text": "x"}, {"app": "TextEdit"}),
        ("set_system_state", {"volume": 0}, {"volume": 0}),
        ("open_url", {"url": "https://example.com"}, {"url": "https://example.com"}),
    ):
        status, body = await desk_op(owner.pk, tool, payload, **target)
        assert (status, body["error"]["code"]) == (409, "paused"), (tool, body)
    assert online_mac.agent.executed == []
    assert (tmp_path / "sandbox" / DESKTOP_STATE).read_text() == before
    rows = await db_async(lambda: list(MacOperation.objects.values_list("kind", "outcome")))()
    assert sorted(rows) == sorted((k, "paused") for k in ("list_windows", "read_clipboard", "type_text", "set_system_state", "open_url"))


@pytest.mark.django_db(transaction=True)
async def test_the_capability_keeps_each_pack_to_its_own_operations_category_and_target(owner: Any, internal_listener_on_loop: Path) -> None:
    def code(answer: tuple[int, Any]) -> str:
        return answer[1]["error"]["code"]

    # a read call cannot act; an act decided as observe cannot act; another app or url is refused
    assert code(await desk_op(owner.pk, "read_clipboard", {"text": "x"}, kind="write_clipboard", category="owner_data")) == "forbidden"
    assert code(await desk_op(owner.pk, "type_text", {"app": "TextEdit", "text": "x"}, category="observe", app="TextEdit")) == "forbidden"
    assert code(await desk_op(owner.pk, "type_text", {"app": "Terminal", "text": "x"}, app="TextEdit")) == "forbidden"
    assert code(await desk_op(owner.pk, "open_url", {"url": "https://evil.example"}, url="https://example.com")) == "forbidden"
    assert code(await desk_op(owner.pk, "open_file", {"path": "b.txt"}, path="a.txt")) == "forbidden"
    # each pack only its own operations: desktop cannot run a command, owner-mac cannot type
    assert code(await desk_op(owner.pk, "run_command", {"argv": ["echo"]})) == "forbidden"
    assert code(await desk_op(owner.pk, "type_text", {"app": "TextEdit", "text": "x"}, pack="owner-mac", app="TextEdit")) == "forbidden"
    # a third pack that declared the mac API gets no operation at all
    assert code(await desk_op(owner.pk, "list_windows", {}, pack="another")) == "forbidden"
    assert not await db_async(MacOperation.objects.exists)()


def test_the_desktop_manifest_reads_observe_acts_owner_data_on_the_relays_kinds_and_ships_off() -> None:
    pack = load_pack(PACK)
    assert len(pack.tools) == 16
    categories = {n: t.resolve_category({}) for n, t in pack.tools.items()}
    assert {n for n, c in categories.items() if c == "observe"} == set(DESKTOP_READ_KINDS)
    assert {n for n, c in categories.items() if c == "owner_data"} == set(DESKTOP_WRITE_KINDS)
    assert set(mac_relay.PACK_KINDS["desktop"]) == set(pack.tools) and set(DESKTOP_READ_KINDS) <= set(mac_relay.READ_KINDS)
    assert not set(DESKTOP_WRITE_KINDS) & set(mac_relay.READ_KINDS)
    assert {n: pack.tools[n].declared_target for n in ("activate_app", "type_text", "open_url", "open_file")} == {
        "activate_app": ["app"], "type_text": ["app"], "open_url": ["url"], "open_file": ["path"]}
    assert pack.platform_api == ["mac"] and pack.enabled_by_default is False and pack.host == "dedicated" and pack.scopes == ["owner"]


def test_the_simulated_desktop_refuses_acting_on_an_app_that_is_not_in_front(tmp_path: Path) -> None:
    box = MacSandbox(tmp_path / "box")
    front_text_app(box)
    box.execute("activate_app", {"app": "Terminal"})
    for kind, payload in (("type_text", {"app": "TextEdit", "text": "rm -rf"}), ("press_keys", {"app": "TextEdit", "keys": "cmd+q"}),
                          ("scroll", {"app": "TextEdit", "dy": 3})):
        assert box.execute(kind, payload)["code"] == "not_frontmost", kind
    assert box.execute("click", {"app": "TextEdit", "x": 5, "y": 5})["code"] == "wrong_app"
    assert box.execute("open_file", {"path": "../x"})["code"] == "path_outside_sandbox"
    assert box.execute("open_file", {"path": DESKTOP_STATE})["code"] == "not_found"
    assert box.execute("open_url", {"url": "javascript:alert(1)"})["code"] == "invalid_request"
    assert box.execute("press_keys", {"app": "Terminal", "keys": "cmd+cmd+q"})["code"] == "invalid_request"
    assert [w["text"] for w in desktop_state(tmp_path / "box")["windows"]] == ["", "", ""]
    # quitting an app through owner-mac's operate_app closes its windows on the desktop
    box.execute("operate_app", {"app": "Terminal", "action": "quit"})
    assert box.execute("list_windows", {})["frontmost_app"] == "TextEdit"


@pytest.mark.django_db(transaction=True)
def test_through_the_gateway_an_unrequested_act_asks_a_card_and_a_read_does_not(internal_listener: Any, make_device: Any, settings: Any) -> None:
    from capabilities.client import call_tool
    from capabilities.mcp_host import runtime
    from consent.models import ConsentCard

    settings.YIMI_PACKS_ENABLE = ["desktop"]
    runtime.reset_for_tests()
    try:
        run_id = str(accept_utterance(make_device().device, new_client_id(), "帮我看看屏幕上开着什么").run_id)
        asked = asyncio.run(call_tool(run_id, "", "desktop__type_text", {"app": "TextEdit", "text": "hello"}))
        assert (asked.decision, asked.executed) == ("ask", False)
        card = ConsentCard.objects.get(call_id=asked.call_id)
        assert card.category == "owner_data"
        asked_url = asyncio.run(call_tool(run_id, "", "desktop__open_url", {"url": "https://example.com"}))
        assert asked_url.decision == "ask" and ConsentCard.objects.get(call_id=asked_url.call_id).category == "owner_data"
        # a read is allowed without a card; no Mac is connected, so the relay says mac_offline (nothing was done)
        read = asyncio.run(call_tool(run_id, "", "desktop__list_windows", {}))
        assert read.decision == "allow" and not ConsentCard.objects.filter(call_id=read.call_id).exists()
        assert read.receipt is not None and read.receipt["error"]["code"] == "mac_offline", read.model_text
        assert list(MacOperation.objects.values_list("kind", "outcome")) == [("list_windows", "mac_offline")]
    finally:
        runtime.reset_for_tests()


@pytest.mark.django_db(transaction=True)
async def test_pack_contract_desktop_passes_on_the_real_server_through_a_connected_mac_and_on_the_fake(
    online_mac: OnlineMac, owner: Any
) -> None:
    out = io.StringIO()

    def run() -> None:
        from django.db import connections

        try:
            call_command("pack_contract", "desktop", "--both", "--against-live", stdout=out)
        finally:
            connections.close_all()  # this worker thread's connection, so the test database can be dropped

    await asyncio.to_thread(run)
    text = out.getvalue()
    assert "2/2 contract runs passed" in text, text
    rows = [line.split()[:3] for line in text.splitlines()[1:] if line.startswith("desktop")]
    assert sorted({tuple(r) for r in rows}) == [("desktop", "fake", "pass"), ("desktop", "real", "pass")], text
    kinds = {kind for _, kind in online_mac.agent.executed}
    assert kinds == set(DESKTOP_KINDS)  # every tool reached the Mac in the real run
