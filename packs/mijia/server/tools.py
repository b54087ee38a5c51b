"""The mijia pack: the owner's Mi Home devices over the local miIO protocol.

The devices are the declared secret ``MIJIA_DEVICES``: a JSON list of ``{"name", "kind"
(lamp, plug or lock), "host", "token" (32 hex digits)}``. The pack talks to each device
with python-miio (``miio.Device.send``): the miIO protocol over UDP port 54321 — a hello
handshake, then JSON commands encrypted with AES-128-CBC under the device token, each
packet with a 32-byte header (magic 0x2131, length, device id, stamp, MD5 checksum). A
device drops a packet whose checksum does not match its token, so a wrong token looks like
no answer at all.

Rules this server keeps whatever the arguments say:

- **Door locks are read-only.** A device declared as ``lock``, or whose model (``miIO.info``,
  asked before every write) is a lock, is never sent a write: ``read_only_device``. The
  manifest maps only on/off and brightness/color temperature to ``physical``, so the
  gateway itself refuses any other value (e.g. ``state: unlock``) before the pack is called;
  the ``lock`` tool's ``lock``/``unlock`` are ``physical`` with task type ``door_lock``, which
  the consent gate blocks (``door_locks_read_only``), and the pack refuses them too.
- **Only bound devices are operated.** ``account`` (action ``bind``) checks the token with the device itself
  (``miIO.info``) and records the binding in the pack's own directory; ``switch`` and
  ``set`` refuse an unbound device with ``not_bound``.
- **Never default to success.** A write is verified by reading the state back; no answer
  is ``unknown``/``DISCONNECTED`` (the device may or may not have acted; check with
  ``status``), a read-back that differs is ``unknown`` with the effect ``not_verified``.

The fake (``fake/tools.py``) runs these handlers on in-memory devices.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from capabilities.packkit import EgressRefused, ToolRegistry, effect, receipt, udp_endpoint, value

TOOLS = ToolRegistry()
DEVICES_SECRET = "MIJIA_DEVICES"
MIIO_PORT = 54321  # python-miio's hello always goes to this port
TIMEOUT_SECONDS = 5
SOURCE = "mijia device"
TOKEN = re.compile(r"[0-9a-fA-F]{32}")

# What the pack knows how to do with each kind of device (miIO commands).
KINDS: dict[str, dict[str, Any]] = {
    "lamp": {"props": ["power", "bright", "ct"], "switch": True,
             "settable": {"brightness": ("set_bright", "bright", 1, 100, "%"), "color_temperature": ("set_ct_abx", "ct", 1700, 6500, "K")}},
    "plug": {"props": ["power"], "switch": True, "settable": {}},
    "lock": {"props": ["lock_state", "battery"], "switch": False, "settable": {}, "read_only": True},
}
PROP_NAMES = {"power": "power", "bright": "brightness", "ct": "color_temperature", "lock_state": "lock_state", "battery": "battery"}
PROP_UNITS = {"bright": "%", "ct": "K", "battery": "%"}


class NoAnswer(Exception):
    """The device did not answer (unreachable, or the token is wrong)."""


class DeviceRefused(Exception):
    def __init__(self, code: Any, message: str) -> None:
        super().__init__(message)
        self.code = code


class HomeDevice(NamedTuple):
    name: str
    kind: str
    host: str
    token: str


class Transport(Protocol):
    def send(self, device: HomeDevice, method: str, params: list[Any]) -> Any: ...


class MiioTransport:
    """python-miio over UDP: one ``miio.Device`` per call (a fresh handshake each time)."""

    def send(self, device: HomeDevice, method: str, params: list[Any]) -> Any:
        import miio  # imported here: the fake never needs it
        from miio.exceptions import DeviceError, DeviceException

        try:
            # The sandbox has no network: datagrams go through the egress proxy's relay, which
            # reaches only the hosts MIJIA_DEVICES lists (the manifest's declaration).
            host, _ = udp_endpoint(device.host, MIIO_PORT)
        except EgressRefused as exc:
            raise DeviceRefused(exc.code, str(exc)) from None
        client = miio.Device(host, device.token, timeout=TIMEOUT_SECONDS)
        try:
            return client.send(method, params, retry_count=0)
        except DeviceError as exc:
            error = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
            raise DeviceRefused(error.get("code"), str(error.get("message", exc))) from None
        except DeviceException:
            raise NoAnswer() from None


# --- configuration and bindings --------------------------------------------------------------


def configured_devices() -> list[HomeDevice] | None:
    """The devices of ``MIJIA_DEVICES``; None when the secret is missing or unreadable."""
    raw = os.environ.get(DEVICES_SECRET, "")
    try:
        rows = json.loads(raw) if raw.strip() else None
    except ValueError:
        return None
    if not isinstance(rows, list):
        return None
    out = []
    for row in rows:
        if (isinstance(row, dict) and isinstance(row.get("name"), str) and row.get("kind") in KINDS
                and isinstance(row.get("host"), str) and isinstance(row.get("token"), str) and TOKEN.fullmatch(row["token"])):
            out.append(HomeDevice(row["name"], row["kind"], row["host"], row["token"].lower()))
    return out


class Bindings:
    """The bound devices' names, in the pack's own directory (``filesystem: own``)."""

    _lock = threading.Lock()

    def path(self) -> Path:
        base = os.environ.get("YIMI_PACKS_DATA_DIR")
        root = Path(base) if base else Path(os.environ.get("YIMI_WORKSPACE_DIR", "workspace")).resolve().parent / "packs"
        directory = root.resolve() / "mijia"
        directory.mkdir(parents=True, exist_ok=True)
        return directory / "bindings.json"

    def read(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path().read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def write(self, data: dict[str, dict[str, Any]]) -> None:
        with self._lock:
            path = self.path()
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, ensure_ascii=False, sort_keys=True), encoding="utf-8")
            os.replace(tmp, path)


class Home:
    """Where the tools act: a transport, the bindings, and the devices (a function, read per
    call, so a changed secret is seen). Plain class: the host loads this module without
    registering it, which dataclasses need."""

    def __init__(self, transport: Transport, bindings: Any, devices: Any = configured_devices) -> None:
        self.transport = transport
        self.bindings = bindings
        self.devices = devices


HOME = Home(MiioTransport(), Bindings())


# --- receipts ----------------------------------------------------------------------------------


def refuse(code: str, message: str, *, retry: str = "forbidden", content: dict[str, Any] | None = None) -> dict[str, Any]:
    return receipt("failed", summary=message, error=(code, message), retry=retry, content=content)


def no_answer(device: HomeDevice, *, write: bool) -> dict[str, Any]:
    message = f"{device.name} did not answer (unreachable, or its token is wrong)"
    if write:
        return receipt("unknown", summary=message, error=("DISCONNECTED", message), unknowns=[f"whether {device.name} changed"],
                       retry="after_check", check_with="status")
    return receipt("unknown", summary=message, error=("DISCONNECTED", message), unknowns=[f"the state of {device.name}"], retry="allowed")


def not_configured() -> dict[str, Any]:
    return refuse("not_configured", f"the secret {DEVICES_SECRET} is not set or not a list of devices")


def find(home: Home, args: dict[str, Any]) -> tuple[HomeDevice | None, dict[str, Any] | None]:
    devices = home.devices()
    if devices is None:
        return None, not_configured()
    name = args.get("device")
    if not isinstance(name, str) or not name.strip():
        return None, refuse("invalid_request", "device (its name) is required")
    for device in devices:
        if device.name == name.strip():
            return device, None
    return None, refuse("not_found", f"no device named {name.strip()!r}", content={"devices": [d.name for d in devices]})


def read_state(home: Home, device: HomeDevice) -> dict[str, Any]:
    props = KINDS[device.kind]["props"]
    answer = home.transport.send(device, "get_prop", list(props))
    if not isinstance(answer, list) or len(answer) != len(props):
        raise DeviceRefused(None, "the device's answer to get_prop was unreadable")
    return {PROP_NAMES[p]: v for p, v in zip(props, answer, strict=True)}


def state_values(device: HomeDevice, state: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for prop, name in PROP_NAMES.items():
        if name in state and state[name] is not None:
            val = state[name]
            out.append(value(f"{device.name}.{name}", val, PROP_UNITS.get(prop) if isinstance(val, int | float) else None, SOURCE))
    return out


def is_read_only(home: Home, device: HomeDevice) -> bool:
    """A lock by its declaration or by the model the device reports (asked every time)."""
    if KINDS[device.kind].get("read_only"):
        return True
    info = home.transport.send(device, "miIO.info", [])
    model = str(info.get("model", "")) if isinstance(info, dict) else ""
    return ".lock." in model or model.endswith(".lock")


def read_only_refusal(device: HomeDevice) -> dict[str, Any]:
    return refuse("read_only_device", f"{device.name} is a door lock: Yimi only reads door locks, it never operates them")


# --- tools ----------------------------------------------------------------------------------------

DEVICE_ARG = {"type": "string", "minLength": 1, "maxLength": 64, "description": "the device's name, e.g. 台灯"}


def devices_tool(home: Home, args: dict[str, Any]) -> dict[str, Any]:
    devices = home.devices()
    if devices is None:
        return not_configured()
    bound = home.bindings.read()
    items, unknowns, values = [], [], []
    for device in devices:
        try:
            state: dict[str, Any] | None = read_state(home, device)
        except (NoAnswer, DeviceRefused):
            state = None
            unknowns.append(f"the state of {device.name}")
        items.append({"name": device.name, "kind": device.kind, "bound": device.name in bound, "read_only": bool(KINDS[device.kind].get("read_only")),
                      "reachable": state is not None, "state": state})
        values += state_values(device, state or {})
    status = "succeeded" if not unknowns else ("partial" if len(unknowns) < len(devices) else "unknown")
    summary = "; ".join(f"{i['name']}: {describe(i['state'])}" for i in items) or "no devices configured"
    return receipt(status, summary=summary, content={"items": items}, values=values, unknowns=unknowns,
                   retry="allowed" if unknowns else None)


def describe(state: dict[str, Any] | None) -> str:
    if state is None:
        return "no answer"
    return ", ".join(f"{k} {v}" for k, v in state.items() if v is not None)


def status_tool(home: Home, args: dict[str, Any]) -> dict[str, Any]:
    device, refusal = find(home, args)
    if device is None:
        return refusal or not_configured()
    try:
        state = read_state(home, device)
        info = home.transport.send(device, "miIO.info", [])
    except NoAnswer:
        return no_answer(device, write=False)
    except DeviceRefused as exc:
        return refuse("device_error", f"{device.name} refused: {exc}", retry="allowed")
    model = str(info.get("model", "")) if isinstance(info, dict) else ""
    content = {"name": device.name, "kind": device.kind, "model": model, "bound": device.name in home.bindings.read(),
               "read_only": bool(KINDS[device.kind].get("read_only")), "state": state}
    return receipt("succeeded", summary=f"{device.name}: {describe(state)}", content=content, values=state_values(device, state))


def write(home: Home, device: HomeDevice, method: str, params: list[Any], check: tuple[str, Any], action: str) -> dict[str, Any]:
    """Refuse locks and unbound devices; send; read back; report what was verified."""
    if device.name not in home.bindings.read():
        return refuse("not_bound", f"{device.name} is not bound to Yimi; bind it first")
    try:
        if is_read_only(home, device):
            return read_only_refusal(device)
        home.transport.send(device, method, params)
    except NoAnswer:
        return no_answer(device, write=True)
    except DeviceRefused as exc:
        return refuse("device_error", f"{device.name} refused {method}: {exc}")
    target = f"mijia:{device.name}"
    try:
        state = read_state(home, device)
    except (NoAnswer, DeviceRefused):
        return receipt("unknown", summary=f"{device.name} took {action} but did not read back", effects=[effect(target, action, "not_verified")],
                       unknowns=[f"whether {device.name} changed"], retry="after_check", check_with="status")
    name, wanted = check
    if state.get(name) != wanted:
        return receipt("unknown", summary=f"{device.name} reads back {name} {state.get(name)}, not {wanted}",
                       effects=[effect(target, action, "not_verified")], values=state_values(device, state),
                       unknowns=[f"whether {device.name} changed"], retry="after_check", check_with="status")
    return receipt("succeeded", summary=f"{device.name}: {describe(state)}", effects=[effect(target, action, "verified")],
                   values=state_values(device, state), content={"name": device.name, "state": state})


def switch_tool(home: Home, args: dict[str, Any]) -> dict[str, Any]:
    device, refusal = find(home, args)
    if device is None:
        return refusal or not_configured()
    if KINDS[device.kind].get("read_only"):
        return read_only_refusal(device)  # whatever the state argument says
    state = args.get("state")
    if state not in ("on", "off"):
        return refuse("invalid_request", "state is on or off")
    if not KINDS[device.kind]["switch"]:
        return refuse("unsupported", f"{device.name} cannot be switched")
    return write(home, device, "set_power", [state], ("power", state), f"power_{state}")


def set_tool(home: Home, args: dict[str, Any]) -> dict[str, Any]:
    device, refusal = find(home, args)
    if device is None:
        return refusal or not_configured()
    if KINDS[device.kind].get("read_only"):
        return read_only_refusal(device)
    prop, level = args.get("property"), args.get("value")
    spec = KINDS[device.kind]["settable"].get(prop)
    if spec is None:
        return refuse("unsupported", f"{device.name} has no settable {prop!r} (settable: {', '.join(KINDS[device.kind]['settable']) or 'none'})")
    method, key, low, high, unit = spec
    if isinstance(level, bool) or not isinstance(level, int) or not low <= level <= high:
        return refuse("invalid_request", f"{prop} is an integer from {low} to {high} {unit}")
    params: list[Any] = [level] if method == "set_bright" else [level, "smooth", 500]
    return write(home, device, method, params, (PROP_NAMES[key], level), f"set_{prop}")


def lock_tool(home: Home, args: dict[str, Any]) -> dict[str, Any]:
    """A door lock: its state (``status``); ``lock``/``unlock`` are refused whatever else the
    arguments say, before anything is sent to the device."""
    action = args.get("action")
    if action in ("lock", "unlock"):
        name = args.get("device") if isinstance(args.get("device"), str) else "the door lock"
        return refuse("read_only_device", f"{name}: Yimi only reads door locks, it never locks or unlocks them")
    if action != "status":
        return refuse("invalid_request", "action is status (door locks are read-only)")
    devices = home.devices()
    if devices is None:
        return not_configured()
    locks = [d for d in devices if KINDS[d.kind].get("read_only")]
    if isinstance(args.get("device"), str) and args["device"].strip():
        locks = [d for d in locks if d.name == args["device"].strip()]
        if not locks:
            return refuse("not_found", f"no door lock named {args['device'].strip()!r}")
    items, values, unknowns = [], [], []
    for device in locks:
        try:
            state: dict[str, Any] | None = read_state(home, device)
        except (NoAnswer, DeviceRefused):
            state = None
            unknowns.append(f"the state of {device.name}")
        items.append({"name": device.name, "reachable": state is not None, "state": state})
        values += state_values(device, state or {})
    status = "succeeded" if not unknowns else ("partial" if len(unknowns) < len(locks) else "unknown")
    summary = "; ".join(f"{i['name']}: {describe(i['state'])}" for i in items) or "no door locks"
    return receipt(status, summary=summary, content={"items": items}, values=values, unknowns=unknowns, retry="allowed" if unknowns else None)


def list_bindings(home: Home, devices: list[HomeDevice]) -> dict[str, Any]:
    bound = home.bindings.read()
    items = [{"name": d.name, "kind": d.kind, "bound": d.name in bound, **({"model": bound[d.name].get("model", "")} if d.name in bound else {})}
             for d in devices]
    summary = ", ".join(i["name"] for i in items if i["bound"]) or "no device is bound"
    return receipt("succeeded", summary=f"bound: {summary}", content={"items": items})


def account_tool(home: Home, args: dict[str, Any]) -> dict[str, Any]:
    action = args.get("action")
    if action == "list":
        devices = home.devices()
        return not_configured() if devices is None else list_bindings(home, devices)
    if action not in ("bind", "unbind"):
        return refuse("invalid_request", "action is list, bind or unbind")
    device, refusal = find(home, args)
    if device is None:
        return refusal or not_configured()
    bound = home.bindings.read()
    target = f"mijia:{device.name}"
    if action == "unbind":
        if device.name in bound:
            bound.pop(device.name)
            home.bindings.write(bound)
        verified = device.name not in home.bindings.read()
        return receipt("succeeded" if verified else "unknown", summary=f"{device.name} is not bound",
                       effects=[effect(target, "unbind", "verified" if verified else "not_verified")])
    try:
        info = home.transport.send(device, "miIO.info", [])
    except NoAnswer:
        return refuse("token_rejected", f"{device.name} did not answer with its token (unreachable, or the token is wrong); nothing was bound",
                      retry="allowed")
    except DeviceRefused as exc:
        return refuse("device_error", f"{device.name} refused miIO.info: {exc}")
    model = str(info.get("model", "")) if isinstance(info, dict) else ""
    bound[device.name] = {"model": model, "kind": device.kind}
    home.bindings.write(bound)
    verified = device.name in home.bindings.read()
    return receipt("succeeded" if verified else "unknown", summary=f"{device.name} ({model}) is bound",
                   effects=[effect(target, "bind", "verified" if verified else "not_verified")], content={"name": device.name, "model": model})


SWITCH_SCHEMA = {"type": "object", "properties": {"device": DEVICE_ARG, "state": {"type": "string", "enum": ["on", "off"]}}, "required": ["device", "state"]}
SET_SCHEMA = {
    "type": "object",
    "properties": {"device": DEVICE_ARG, "property": {"type": "string", "enum": ["brightness", "color_temperature"]},
                   "value": {"type": "integer", "description": "brightness 1-100 (%), color temperature 1700-6500 (K)"}},
    "required": ["device", "property", "value"],
}
DEVICE_SCHEMA = {"type": "object", "properties": {"device": DEVICE_ARG}, "required": ["device"]}
LOCK_SCHEMA = {"type": "object", "properties": {"device": DEVICE_ARG, "action": {"type": "string", "enum": ["status", "lock", "unlock"]}}, "required": ["action"]}
ACCOUNT_SCHEMA = {"type": "object", "properties": {"device": DEVICE_ARG, "action": {"type": "string", "enum": ["list", "bind", "unbind"]}}, "required": ["action"]}


def register(tools: ToolRegistry, home_of: Any) -> None:
    """Declare the six tools on ``tools``, each running on ``home_of()`` (real or fake)."""

    @tools("List the home's devices with their current state.")
    def devices(args: dict[str, Any]) -> dict[str, Any]:
        return devices_tool(home_of(), args)

    @tools("Read one device's state and model.", DEVICE_SCHEMA)
    def status(args: dict[str, Any]) -> dict[str, Any]:
        return status_tool(home_of(), args)

    @tools("Turn a bound lamp or plug on or off. Door locks are read-only.", SWITCH_SCHEMA)
    def switch(args: dict[str, Any]) -> dict[str, Any]:
        return switch_tool(home_of(), args)

    @tools("Set a bound lamp's brightness or color temperature.", SET_SCHEMA)
    def set(args: dict[str, Any]) -> dict[str, Any]:  # noqa: A001 - the tool's name
        return set_tool(home_of(), args)

    @tools("A door lock's state (action status); door locks are read-only.", LOCK_SCHEMA)
    def lock(args: dict[str, Any]) -> dict[str, Any]:
        return lock_tool(home_of(), args)

    @tools("List the bound devices, bind (checking the token with the device) or unbind one.", ACCOUNT_SCHEMA)
    def account(args: dict[str, Any]) -> dict[str, Any]:
        return account_tool(home_of(), args)


register(TOOLS, lambda: HOME)
