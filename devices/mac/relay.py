"""The Mac relay: operations on the owner's paired Mac over its ``/ws/device/`` socket
(docs/protocol.md, "The Mac relay"; the crypto is devices/mac/crypto.py).

The only writer of ``MacKey``, ``MacPause`` and ``MacOperation`` (the command log).

One operation (``relay``), called by the ``owner-mac`` pack's internal endpoint
(devices/mac/internal.py) for the owner of the call:

1. refused with ``paused`` (logged) when the owner paused Mac operations;
2. the owner's Mac with a registered X25519 key (the latest ``mac.hello``), else
   ``mac_offline``;
3. the payload is sealed to that key with a fresh ephemeral key (the keys stay in this
   process's memory), the ``mac.op`` frame is signed with the instance key and sent to the
   Mac's channel group with a reply channel of this process;
4. a socket of that Mac forwards it and says so (``mac.accepted``) — none within
   ``MAC_OP_ACCEPT_SECONDS``: ``mac_offline`` (nothing was sent to a Mac);
5. the Mac's ``mac.result`` (its signature checked by the socket, the payload decrypted
   here) within ``MAC_OP_TIMEOUT_SECONDS``, else ``mac_timeout`` (the Mac may or may not
   have done it: never reported as done or failed);
6. the command log row is finished with what the owner may read (kind, target, outcome,
   exit code, size, digest) and the decrypted result goes back to the pack.

The pause is checked once, before sending: an operation already on its way when the owner
pauses is answered by the Mac, which refuses it itself while it knows it is paused.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import DEFAULT_CHANNEL_LAYER, InMemoryChannelLayer, channel_layers, get_channel_layer
from django.conf import settings
from django.utils import timezone

from accounts.identity import sign_as_instance
from accounts.models import Device
from accounts.services import device_scope_limit
from devices.mac import crypto as mac_crypto
from devices.mac.desktop import DESKTOP_KINDS, DESKTOP_READ_KINDS, DESKTOP_WRITE_KINDS
from devices.mac.models import MacKey, MacOperation, MacPause
from yimi_project import push
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

OWNER_MAC_READ_KINDS = ("read_file", "list_dir", "screenshot")
OWNER_MAC_WRITE_KINDS = ("write_file", "run_command", "operate_app")
READ_KINDS = OWNER_MAC_READ_KINDS + DESKTOP_READ_KINDS  # an observe (or owner_data) decision
WRITE_KINDS = OWNER_MAC_WRITE_KINDS + DESKTOP_WRITE_KINDS  # an owner_data decision
KINDS = READ_KINDS + WRITE_KINDS
# The packs that may use the relay and the operations each may ask for (each operation is
# also the name of that pack's tool that does it; devices/mac/internal.py checks both).
PACK_KINDS = {"owner-mac": OWNER_MAC_READ_KINDS + OWNER_MAC_WRITE_KINDS, "desktop": DESKTOP_KINDS}
PAUSE_KINDS = ("phone", "mac")  # the devices the owner pauses from: the phone, the Mac's hotkey
OPS_REMEMBERED = 64  # per socket: ops sent and not answered


# --- keys and the pause ----------------------------------------------------------------------


def register_key(device: Device, x25519_public: Any, signature: Any) -> MacKey:
    """A ``mac.hello``: the owner's Mac registers its X25519 key, signed with its paired key."""
    if device.kind != Device.Kind.MAC:
        raise YimiError("forbidden", "only a Mac registers a relay key")
    if device_scope_limit(device) is not None:
        raise YimiError("forbidden", "a guest device is not a Mac Yimi operates")
    try:
        mac_crypto.decode_x25519_public(x25519_public)
    except mac_crypto.SealError as exc:
        raise YimiError("invalid_frame", f"x25519_public_key: {exc}") from None
    if not device.verify_signature(mac_crypto.hello_message(str(device.id), x25519_public), signature):
        raise YimiError("bad_signature", "the hello is not signed by this device's key")
    key, _ = MacKey.objects.update_or_create(device=device, defaults={"x25519_public_key": x25519_public, "registered_at": timezone.now()})
    return key


def is_paused(owner_id: int) -> bool:
    return MacPause.objects.filter(owner_id=owner_id, paused=True).exists()


def set_pause(device: Device, nonce: str, paused: Any, signature: Any) -> MacPause:
    """A signed ``mac.pause`` from the owner's phone or Mac: pause or resume every Mac operation."""
    if not isinstance(paused, bool):
        raise YimiError("invalid_frame", "paused must be true or false")
    if device_scope_limit(device) is not None:
        raise YimiError("forbidden", "only the owner's own devices pause Yimi's Mac operations")
    if device.kind not in PAUSE_KINDS:
        raise YimiError("forbidden", "Mac operations are paused from the owner's phone or Mac")
    if not device.verify_signature(mac_crypto.pause_message(str(device.id), nonce, paused), signature):
        raise YimiError("bad_signature", "the pause is not signed by this device's key")
    row, _ = MacPause.objects.update_or_create(
        owner_id=device.owner_id, defaults={"paused": paused, "changed_at": timezone.now(), "changed_by": device}
    )
    log_event("mac_pause", paused=paused, device_id=str(device.id))
    return row


# --- one operation ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    op_id: str
    device_id: str
    mac_public: str


def describe_target(kind: str, payload: dict[str, Any]) -> str:
    """What the command log shows as the operation's target (owner-readable plain text)."""
    if kind in ("read_file", "write_file", "list_dir"):
        return str(payload.get("path", "."))[:1024]
    if kind == "run_command":
        argv = payload.get("argv")
        return " ".join(str(a) for a in argv)[:1024] if isinstance(argv, list) else ""
    if kind == "operate_app":
        return f"{payload.get('action', '')} {payload.get('app', '')}"[:1024]
    # the desktop pack's: the app, url, path, keys, point or settings acted on -- never a text typed or copied
    if kind in ("activate_app", "type_text", "scroll"):
        return str(payload.get("app", ""))[:1024]
    if kind == "press_keys":
        return f"{payload.get('keys', '')} in {payload.get('app', '')}"[:1024]
    if kind == "click":
        where = payload.get("element") if "element" in payload else f"({payload.get('x')}, {payload.get('y')})"
        return f"{payload.get('app') or ''} {where}".strip()[:1024]
    if kind == "open_url":
        return str(payload.get("url", ""))[:1024]
    if kind == "open_file":
        return str(payload.get("path", ""))[:1024]
    if kind == "find_files":
        return f"{payload.get('name', '')} in {payload.get('under', '.')}"[:1024]
    if kind == "capture_region":
        return f"{payload.get('x')},{payload.get('y')} {payload.get('width')}x{payload.get('height')}"[:1024]
    if kind == "set_system_state":
        return " ".join(f"{k}={payload[k]}" for k in ("volume", "muted", "dark_mode") if k in payload)[:1024]
    return ""


def _prepare(owner_id: int, kind: str, payload: dict[str, Any], call_id: str, tool: str) -> Prepared:
    now = timezone.now()
    base = {"owner_id": owner_id, "kind": kind, "target": describe_target(kind, payload), "call_id": call_id[:80],
            "tool": tool[:100], "requested_at": now}
    if is_paused(owner_id):
        MacOperation.objects.create(**base, outcome=MacOperation.Outcome.PAUSED, error_code="paused", finished_at=now)
        raise YimiError("paused", "the owner paused Yimi's Mac operations")
    key = (
        MacKey.objects.filter(device__owner_id=owner_id, device__kind=Device.Kind.MAC, device__revoked_at=None, device__is_guest=False)
        .select_related("device").order_by("-registered_at").first()
    )
    if key is None:
        MacOperation.objects.create(**base, outcome=MacOperation.Outcome.OFFLINE, error_code="mac_offline", finished_at=now)
        raise YimiError("mac_offline", "no paired Mac has registered its relay key (mac.hello)")
    op = MacOperation.objects.create(**base, device=key.device, outcome=MacOperation.Outcome.SENT)
    return Prepared(str(op.id), str(key.device_id), key.x25519_public_key)


def _finish(op_id: str, outcome: str, *, error_code: str = "", result: dict[str, Any] | None = None) -> None:
    fields: dict[str, Any] = {"outcome": outcome, "error_code": error_code[:64], "finished_at": timezone.now()}
    result = result or {}
    if isinstance(result.get("exit_code"), int):
        fields["exit_code"] = result["exit_code"]
    size = result.get("size", result.get("stdout_size"))
    if isinstance(size, int) and not isinstance(size, bool):
        fields["size_bytes"] = size
    digest = result.get("sha256", result.get("stdout_sha256"))
    if isinstance(digest, str) and len(digest) == 64:
        fields["sha256"] = digest
    # compare-and-set: only a row still waiting is finished (a late second answer changes nothing)
    MacOperation.objects.filter(id=op_id, outcome=MacOperation.Outcome.SENT).update(**fields)


async def _wait(layer: Any, channel: str, op_id: str, kind: str, seconds: float) -> dict[str, Any] | None:
    """The next message of ``kind`` for ``op_id`` on our reply channel, or None after ``seconds``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            return None
        try:
            message = await asyncio.wait_for(layer.receive(channel), remaining)
        except TimeoutError:
            return None
        if message.get("type") == kind and message.get("op_id") == op_id:
            return message


async def relay(owner_id: int, kind: str, payload: dict[str, Any], *, call_id: str = "", tool: str = "") -> dict[str, Any]:
    """One operation on the owner's Mac (the module docstring's steps); the Mac's result
    payload, decrypted. Raises ``YimiError`` ``paused``, ``mac_offline`` or ``mac_timeout``."""
    if kind not in KINDS:
        raise YimiError("invalid_request", f"kind is one of {', '.join(KINDS)}")
    prepared = await database_sync_to_async(_prepare)(owner_id, kind, payload, call_id, tool)
    op_id = prepared.op_id
    keys = mac_crypto.platform_keys(prepared.mac_public, op_id)
    nonce, ciphertext = mac_crypto.seal(keys.op_key, {**payload, "kind": kind}, mac_crypto.associated_data(op_id, kind))
    expires_at = int(time.time() + settings.MAC_OP_TIMEOUT_SECONDS)
    frame = {
        "type": "mac.op", "op_id": op_id, "kind": kind, "epk": keys.epk, "nonce": nonce, "ciphertext": ciphertext,
        "expires_at": expires_at,
        "signature": await database_sync_to_async(sign_as_instance)(
            mac_crypto.op_message(prepared.device_id, op_id, kind, keys.epk, nonce, ciphertext, expires_at)
        ),
    }
    layer, own_layer = waiter_layer()
    try:
        return await _send_and_wait(layer, prepared, kind, frame, keys)
    finally:
        if own_layer:
            await layer.close_pools()


def waiter_layer() -> tuple[Any, bool]:
    """The channel layer this operation waits on, and whether it is its own. On Redis, a
    layer of its own: a ``channels_redis`` layer receives on one event loop only, and the
    process's sockets already receive on theirs (the internal listener may run this on
    another loop). In memory (one process, one loop) the shared layer is the only one."""
    shared = get_channel_layer()
    if isinstance(shared, InMemoryChannelLayer):
        return shared, False
    return channel_layers.make_backend(DEFAULT_CHANNEL_LAYER), True


async def _send_and_wait(layer: Any, prepared: Prepared, kind: str, frame: dict[str, Any], keys: mac_crypto.OpKeys) -> dict[str, Any]:
    op_id = prepared.op_id
    reply = await layer.new_channel("mac-op.")
    await layer.group_send(push.device_group(prepared.device_id), {"type": "mac.op", "reply_channel": reply, "frame": frame})
    if await _wait(layer, reply, op_id, "mac.accepted", settings.MAC_OP_ACCEPT_SECONDS) is None:
        await database_sync_to_async(_finish)(op_id, MacOperation.Outcome.OFFLINE, error_code="mac_offline")
        raise YimiError("mac_offline", "the owner's Mac is not connected")
    answer = await _wait(layer, reply, op_id, "mac.result", settings.MAC_OP_TIMEOUT_SECONDS)
    if answer is None:
        await database_sync_to_async(_finish)(op_id, MacOperation.Outcome.TIMEOUT, error_code="mac_timeout")
        raise YimiError("mac_timeout", "the Mac took the operation but sent no result in time; it may or may not have done it")
    status = answer["frame"]["status"]
    try:
        result = mac_crypto.open_sealed(keys.result_key, answer["frame"].get("nonce"), answer["frame"].get("ciphertext"),
                                        mac_crypto.result_aad(op_id, kind, status))
    except mac_crypto.SealError as exc:
        await database_sync_to_async(_finish)(op_id, MacOperation.Outcome.ERROR, error_code="bad_result")
        raise YimiError("mac_timeout", f"the Mac's result did not decrypt ({exc}); whether it acted is unknown") from None
    if status == "ok":
        await database_sync_to_async(_finish)(op_id, MacOperation.Outcome.OK, result=result)
    else:
        await database_sync_to_async(_finish)(op_id, MacOperation.Outcome.ERROR, error_code=str(result.get("code", "error")), result=result)
    return {"op_id": op_id, "status": status, **{k: v for k, v in result.items() if k != "status"}}


# --- the device socket's side (devices/consumers/ calls these) -----------------------------


async def on_hello(consumer: Any, frame: dict[str, Any]) -> None:
    """``mac.hello``: register the Mac's X25519 key; answer ``mac.hello.ok`` with the pause."""
    device = consumer.device
    key = await database_sync_to_async(register_key)(device, frame.get("x25519_public_key"), frame.get("signature"))
    paused = await database_sync_to_async(is_paused)(device.owner_id)
    await consumer._send({"type": "mac.hello.ok", "id": frame.get("id"), "registered_at": key.registered_at.isoformat(), "paused": paused})


async def on_pause(consumer: Any, frame: dict[str, Any]) -> None:
    """``mac.pause`` from the phone or the Mac: ``mac.pause.ok``, and ``mac.paused`` to every owner device."""
    device = consumer.device
    row = await database_sync_to_async(set_pause)(device, consumer.nonce, frame.get("paused"), frame.get("signature"))
    state = {"paused": row.paused, "changed_at": row.changed_at.isoformat(), "by_device": str(device.id)}
    await consumer._send({"type": "mac.pause.ok", "id": frame.get("id"), **state})
    await push.to_owner(device.owner_id, {"type": "mac.paused", **state})


async def on_result(consumer: Any, frame: dict[str, Any]) -> None:
    """``mac.result`` from the Mac: checked (an op this socket delivered, signed by this
    device) and handed to the process waiting for it; ``mac.result.ok`` to the Mac."""
    device = consumer.device
    ops: dict[str, tuple[str, str]] = consumer.__dict__.setdefault("_mac_ops", {})
    op_id, status = frame.get("op_id"), frame.get("status")
    if not isinstance(op_id, str) or op_id not in ops:
        raise YimiError("unknown_op", "no operation with this op_id is waiting on this socket")
    if status not in ("ok", "error") or not isinstance(frame.get("nonce"), str) or not isinstance(frame.get("ciphertext"), str):
        raise YimiError("invalid_frame", "a result has status ok/error, nonce and ciphertext")
    message = mac_crypto.result_message(str(device.id), op_id, status, frame["nonce"], frame["ciphertext"])
    if not device.verify_signature(message, frame.get("signature")):
        raise YimiError("bad_signature", "the result is not signed by this device's key")
    reply_channel, _ = ops.pop(op_id)
    await consumer.channel_layer.send(reply_channel, {
        "type": "mac.result", "op_id": op_id,
        "frame": {"status": status, "nonce": frame["nonce"], "ciphertext": frame["ciphertext"]},
    })
    await consumer._send({"type": "mac.result.ok", "id": frame.get("id"), "op_id": op_id})


async def deliver_op(consumer: Any, event: dict[str, Any]) -> None:
    """A ``mac.op`` from the relay, for this socket's device: forwarded to the Mac and
    acknowledged to the waiting process (``mac.accepted``). Only an owner's Mac takes it."""
    device = consumer.device
    frame = event.get("frame") or {}
    if device is None or device.kind != Device.Kind.MAC or device.is_guest or not isinstance(frame.get("op_id"), str):
        return
    ops: dict[str, tuple[str, str]] = consumer.__dict__.setdefault("_mac_ops", {})
    ops[frame["op_id"]] = (event["reply_channel"], frame.get("kind", ""))
    while len(ops) > OPS_REMEMBERED:
        ops.pop(next(iter(ops)))
    await consumer._send(dict(frame))
    await consumer.channel_layer.send(event["reply_channel"], {"type": "mac.accepted", "op_id": frame["op_id"]})


async def deliver_paused(consumer: Any, event: dict[str, Any]) -> None:
    if consumer.device is not None and not consumer.device.is_guest:
        await consumer._send(dict(event))

