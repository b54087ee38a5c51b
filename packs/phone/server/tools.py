"""The phone pack: errands on a cloud phone, one model step at a time, inside CheckoutStop.

The cloud phone is reached through its HTTP API at the declared secret ``PHONE_API_URL``
(optional bearer token ``PHONE_API_TOKEN``); the API is described in ``fake/world.py``
(devices, leases, screen tree, tap, input, launch, home, app login data save/restore).
Standard library only.

A task (``start_task``) runs on a worker thread of this pack's own (dedicated) host:

1. **lease**: an in-process mutex per device, a per-device file lock (``fcntl.flock`` in the
   pack's own directory) and the phone service's lease, so only one task drives a phone;
2. **precheck**: the device is running and its screen tree is readable;
3. **prepare**: back to the home screen, the requested app launched;
4. **model loop**: each step reads the screen tree and asks the model (the platform's
   ``executor_fast`` role) for one action — tap(node), input(node, text), launch(app),
   done, fail — at most ``max_steps`` steps (80 by default, 1–120) and at most
   ``model_phase_seconds`` (600 s by default and at most; the argument lowers it);
5. **CheckoutStop** wraps every tap and input: it looks at the tap target and at the
   payment controls on the page (``CHECKOUT_ENTRY``/``PAYMENT_CONTROL`` words and resource
   ids, never the model's account of the page). Without a payment intent (the platform's
   trusted ``payment_intent_id``; a model cannot supply one) a step that would enter a
   checkout or pay is refused (``checkout_without_intent``) and the task stops, reporting
   what the order would be; a screen that is a checkout anyway stops it the same way. With
   an intent it stops at the checkout, reads back merchant, items, amount, payee and ETA,
   and hands over to the payment flow in the same lease (``awaiting_payment``); only
   ``task_control(action="pay")`` with the owner's authorization taps the pay control,
   after reading the amount again (it must equal the authorized amount);
6. **end**: on a timeout or a cancel the workflow stops (the worker checks between steps
   and finishes the tap or input in flight), the canceller waits for that cleanup, and only
   then is the phone released. A failed task the owner did not cancel gets one read-only
   self-check (the screen read once more, nothing tapped) before the release.

State: every snapshot of a task is a receipt carrying the task id and a revision that
increases with each snapshot. Snapshots are written under
``$YIMI_PACKS_DATA_DIR/phone/tasks/<task>/`` (``filesystem: own``): ``state.json`` while
it runs, a ``running`` marker, and at the end ``terminal.json`` — written atomically (a
temporary file, fsync, rename, fsync of the directory) before the marker is removed. One
reader (``read_record``) answers status and duplicate checks; a task found with its
marker but no worker (the host restarted) is ``unknown``, never done.

The model: the pack holds no model key. It asks the platform (``platform_api:
executor``, ``POST /internal/executor/chat/`` with the call's capability), which answers
with the ``executor_fast`` role's model. A deployer may instead point the declared secret
``PHONE_MODEL_URL`` at a keyless OpenAI-compatible endpoint (a local model server); the
tests use that with a scripted model.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from pathlib import Path
from threading import Event, RLock
from typing import Any

from capabilities import packkit
from capabilities.packkit import ToolRegistry, effect, receipt, value

TOOLS = ToolRegistry()
URL_SECRET, TOKEN_SECRET, MODEL_URL_SECRET = "PHONE_API_URL", "PHONE_API_TOKEN", "PHONE_MODEL_URL"
DEFAULT_STEPS, MIN_STEPS, MAX_STEPS = 80, 1, 120
MODEL_PHASE_SECONDS = 600.0  # the default and the ceiling; a task's argument may lower it
START_WAIT_SECONDS, MAX_WAIT_SECONDS = 20.0, 60.0  # how long start_task waits for an early end
CLEANUP_WAIT_SECONDS = 60.0  # how long a cancel waits for the step in flight to finish
HTTP_TIMEOUT_SECONDS = 30.0
MODEL_TIMEOUT_SECONDS = 120.0
MAX_BAD_ANSWERS = 3  # model answers in a row that are no action: the task fails
HISTORY_KEPT = 8  # earlier actions shown to the model
SOURCE_PAGE = "the checkout page on the phone"

# CheckoutStop's words: a tap on one of these enters a checkout or pays.
CHECKOUT_ENTRY = re.compile(r"结算|提交订单|去支付|下单|checkout|place order", re.IGNORECASE)
PAYMENT_CONTROL = re.compile(r"立即支付|确认支付|确认付款|付款|支付|pay now|confirm payment|\bpay\b", re.IGNORECASE)
CHECKOUT_TITLE = re.compile(r"收银台|确认订单|checkout|payment", re.IGNORECASE)
CHECKOUT_IDS = re.compile(r"btn_checkout|btn_pay|checkout|pay", re.IGNORECASE)

# Replaceable by tests and the fake: the clock, the phone's transport and the model.
clock: Callable[[], float] = time.monotonic
transport: Callable[[str, str, dict[str, Any] | None], tuple[int, dict[str, Any]]] | None = None
model: Callable[[list[dict[str, Any]]], str] | None = None
ROOT: Path | None = None

RUNNING_STATES = ("queued", "leasing", "prechecking", "preparing", "running", "ending")
TERMINAL_STATES = ("succeeded", "failed", "cancelled", "timed_out", "refused")


class PhoneLost(Exception):
    """The phone service could not be asked (TIMEOUT / DISCONNECTED): outcome unknown."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class PhoneRefused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# --- the phone service -----------------------------------------------------------------------


def _http(method: str, path: str, body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
    base = os.environ.get(URL_SECRET, "").rstrip("/")
    if not base:
        raise PhoneRefused("not_configured", f"the secret {URL_SECRET} is not set")
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    token = os.environ.get(TOKEN_SECRET, "")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, method=method, headers=headers)  # noqa: S310 - the deployer's URL
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_SECONDS) as response:  # noqa: S310
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {}
    except TimeoutError:
        raise PhoneLost("TIMEOUT", "the phone service did not answer in time") from None
    except (urllib.error.URLError, OSError) as exc:
        if isinstance(getattr(exc, "reason", None), TimeoutError):
            raise PhoneLost("TIMEOUT", "the phone service did not answer in time") from None
        raise PhoneLost("DISCONNECTED", "the phone service could not be reached") from None
    except ValueError:
        raise PhoneLost("DISCONNECTED", "the phone service's answer was unreadable") from None


def phone(method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One API request; a 2xx body, or ``PhoneRefused`` with the service's error code."""
    status, answer = (transport or _http)(method, path, body)
    if 200 <= status < 300 and isinstance(answer, dict):
        return answer
    error = answer.get("error") if isinstance(answer, dict) else None
    code = str(error.get("code", "")) if isinstance(error, dict) else ""
    message = str(error.get("message", "")) if isinstance(error, dict) else ""
    raise PhoneRefused(code or f"http_{status}", message or f"the phone service answered HTTP {status}")


# --- the model ---------------------------------------------------------------------------------

SYSTEM = (
    "You operate an Android phone for the owner, one action per step. You get the goal, the screen as a JSON tree "
    "(nodes with id, role, text) and your earlier actions. Answer with ONE JSON object and nothing else: "
    '{"action": "tap", "node": ID} | {"action": "input", "node": ID, "text": TEXT} | {"action": "launch", "app": APP} | '
    '{"action": "done", "summary": TEXT} | {"action": "fail", "reason": TEXT}. Never pay: stop at a checkout.'
)


def ask_model(messages: list[dict[str, Any]], timeout: float) -> str:
    """One model step: the platform's executor_fast role (or the deployer's keyless
    endpoint ``PHONE_MODEL_URL``). Raises ``PhoneRefused`` (model_failed) or ``PhoneLost``."""
    if model is not None:
        return model(messages)
    url = os.environ.get(MODEL_URL_SECRET, "").rstrip("/")
    if url:
        body = json.dumps({"model": "executor_fast", "messages": messages, "stream": False}).encode()
        request = urllib.request.Request(url + "/chat/completions", data=body, method="POST", headers={"Content-Type": "application/json"})  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=max(1.0, timeout)) as response:  # noqa: S310 - the deployer's URL
                answer = json.loads(response.read())
            return str(answer["choices"][0]["message"]["content"] or "")
        except (TimeoutError, urllib.error.URLError, OSError) as exc:
            raise PhoneLost("MODEL_TIMEOUT" if "timed out" in str(exc) else "MODEL_DISCONNECTED", "the model could not be asked") from None
        except (ValueError, KeyError, IndexError, TypeError):
            raise PhoneRefused("model_failed", "the model's answer was unreadable") from None
    try:
        status, answer = packkit.platform_call("POST", "executor/chat/", {"role": "executor_fast", "messages": messages})
    except packkit.PlatformNotConfigured as exc:
        raise PhoneRefused("model_not_configured", str(exc)) from None
    except packkit.PlatformLost as exc:
        raise PhoneLost(f"MODEL_{exc.code}", str(exc)) from None
    if status != 200 or not isinstance(answer, dict) or not isinstance(answer.get("text"), str):
        code = ((answer or {}).get("error") or {}).get("code", f"http_{status}") if isinstance(answer, dict) else f"http_{status}"
        raise PhoneRefused("model_failed", f"the platform's executor model did not answer ({code})")
    return answer["text"]


def parse_action(text: str) -> dict[str, Any] | None:
    """The one action in a model answer (a JSON object, possibly fenced), or None."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        action = json.loads(text[start:end + 1])
    except ValueError:
        return None
    if not isinstance(action, dict):
        return None
    kind = action.get("action")
    if kind == "tap" and isinstance(action.get("node"), str):
        return {"action": "tap", "node": action["node"]}
    if kind == "input" and isinstance(action.get("node"), str) and isinstance(action.get("text"), str) and len(action["text"]) <= 2000:
        return {"action": "input", "node": action["node"], "text": action["text"]}
    if kind == "launch" and isinstance(action.get("app"), str):
        return {"action": "launch", "app": action["app"]}
    if kind in ("done", "fail"):
        return {"action": kind, "text": str(action.get("summary") or action.get("reason") or "")[:500]}
    return None


# --- CheckoutStop ------------------------------------------------------------------------------


def _words(node: dict[str, Any]) -> str:
    return f"{node.get('text', '')} {node.get('resource_id', '')}"


def is_payment_control(node: dict[str, Any]) -> bool:
    return node.get("role") == "button" and bool(PAYMENT_CONTROL.search(str(node.get("text", ""))) or re.search(r"btn_pay", str(node.get("resource_id", ""))))


def is_checkout_entry(node: dict[str, Any]) -> bool:
    return node.get("role") == "button" and bool(CHECKOUT_ENTRY.search(str(node.get("text", ""))) or re.search(r"btn_checkout", str(node.get("resource_id", ""))))


def at_checkout(screen: dict[str, Any]) -> bool:
    """A checkout page: a payment control on the page, or a checkout title."""
    return bool(CHECKOUT_TITLE.search(str(screen.get("title", "")))) or any(is_payment_control(n) for n in screen.get("nodes", []))


def checkout_stop(action: dict[str, Any], screen: dict[str, Any], intent: str) -> str:
    """What CheckoutStop says about one tap or input on ``screen``: ``go``, ``refuse``
    (no payment intent: entering the checkout or paying is not this task's to do) or
    ``hand_over`` (an intent: stop here, the payment flow takes over)."""
    nodes = {n.get("id"): n for n in screen.get("nodes", [])}
    target = nodes.get(action.get("node")) if action["action"] in ("tap", "input") else None
    paying = at_checkout(screen) or (target is not None and is_payment_control(target))
    entering = target is not None and action["action"] == "tap" and is_checkout_entry(target)
    if not (paying or entering):
        return "go"
    if not intent:
        return "refuse"
    return "hand_over" if paying else "go"  # with an intent it may open the checkout, and stops there


def checkout_view(screen: dict[str, Any]) -> dict[str, Any]:
    """What the checkout page says, by resource id (read back, never the model's words)."""
    by_id = {str(n.get("resource_id")): str(n.get("text", "")) for n in screen.get("nodes", [])}
    amount_text = by_id.get("checkout_amount", "")
    digits = re.sub(r"[^0-9.]", "", amount_text)
    try:
        amount = str(Decimal(digits).quantize(Decimal("0.01"))) if digits else ""
    except InvalidOperation:
        amount = ""
    items = [i for i in re.split(r"[、,]\s*", by_id.get("order_items", "")) if i]
    return {"merchant": by_id.get("merchant", ""), "items": items, "amount": amount, "payee": by_id.get("payee", ""), "eta": by_id.get("eta", "")}


# --- state on disk -----------------------------------------------------------------------------


def root() -> Path:
    if ROOT is not None:
        return ROOT
    base = os.environ.get("YIMI_PACKS_DATA_DIR")
    return (Path(base) if base else Path(tempfile.gettempdir()) / "yimi-packs") / "phone"


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    """Temporary file, fsync, rename over ``path``, fsync of the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(json.dumps(data, ensure_ascii=False, sort_keys=True).encode())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def task_dir(task_id: str) -> Path:
    return root() / "tasks" / task_id


def read_record(task_id: str) -> dict[str, Any] | None:
    """The one reader of a task's state: the terminal file, else the latest snapshot."""
    if not re.fullmatch(r"pt-[0-9a-f]{16,32}", task_id):
        return None
    folder = task_dir(task_id)
    for name in ("terminal.json", "state.json"):
        with contextlib.suppress(FileNotFoundError, ValueError):
            return json.loads((folder / name).read_text(encoding="utf-8"))
    return None


# --- the lease ---------------------------------------------------------------------------------

_device_locks: dict[str, threading.Lock] = {}
_registry_lock = threading.Lock()


class Lease:
    """One task's hold on one phone: process mutex, per-device file lock, service lease."""

    def __init__(self, device_id: str, holder: str) -> None:
        self.device_id, self.holder = device_id, holder
        self.lease_id: str | None = None
        self._mutex: threading.Lock | None = None
        self._file: Any = None

    def acquire(self) -> None:
        with _registry_lock:
            mutex = _device_locks.setdefault(self.device_id, threading.Lock())
        if not mutex.acquire(blocking=False):
            raise PhoneRefused("device_busy", f"another task of this host drives {self.device_id}")
        self._mutex = mutex
        try:
            locks = root() / "locks"
            locks.mkdir(parents=True, exist_ok=True)
            self._file = open(locks / f"{hashlib.sha256(self.device_id.encode()).hexdigest()[:16]}.lock", "a+")  # noqa: SIM115
            try:
                fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise PhoneRefused("device_busy", f"another process drives {self.device_id}") from None
            answer = phone("POST", f"/v1/devices/{self.device_id}/leases", {"holder": self.holder})
            self.lease_id = str(answer["lease_id"])
        except BaseException:
            self._unlock()
            raise

    def release(self) -> bool:
        """Give the phone back; True when the service confirmed it."""
        confirmed = False
        try:
            if self.lease_id is not None:
                with contextlib.suppress(PhoneRefused):
                    phone("DELETE", f"/v1/leases/{self.lease_id}")
                    confirmed = True
        except PhoneLost:
            confirmed = False
        finally:
            self._unlock()
        return confirmed

    def _unlock(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None
        if self._mutex is not None:
            self._mutex.release()
            self._mutex = None


# --- tasks -------------------------------------------------------------------------------------


class Task:
    """One errand's state (a plain class: the host loads this file without registering it
    as a module, which dataclasses need)."""

    def __init__(self, task_id: str, goal: str, kind: str, app: str, device_id: str, max_steps: int, model_phase_seconds: float,
                 payment_intent_id: str) -> None:
        self.id, self.goal, self.kind, self.app, self.device_id = task_id, goal, kind, app, device_id
        self.max_steps, self.model_phase_seconds, self.payment_intent_id = max_steps, model_phase_seconds, payment_intent_id
        self.state = "queued"
        self.revision = 0
        self.steps = 0
        self.summary = ""
        self.error: tuple[str, str] | None = None
        self.checkout: dict[str, Any] | None = None
        self.history: list[dict[str, Any]] = []
        self.self_check: dict[str, Any] | None = None
        self.cancel_requested = False
        self.lease: Lease | None = None
        self.released: bool | None = None
        self.paid: dict[str, Any] | None = None
        self.finished = False  # the end is done: self-check, release; the terminal file follows
        self.done = Event()  # the worker has let go of the task (ended, or waits at the checkout)
        self.lock = RLock()
        self.cancel = Event()

    def record(self) -> dict[str, Any]:
        ending = self.state in TERMINAL_STATES and not self.finished  # decided, but not yet cleaned up and released
        return {
            "task_id": self.id, "revision": self.revision, "state": "ending" if ending else self.state, "goal": self.goal, "kind": self.kind, "app": self.app,
            "device_id": self.device_id, "max_steps": self.max_steps, "model_phase_seconds": self.model_phase_seconds,
            "payment_intent_id": self.payment_intent_id, "steps": self.steps, "summary": self.summary,
            "error": {"code": self.error[0], "message": self.error[1]} if self.error else None, "checkout": self.checkout,
            "history": self.history[-HISTORY_KEPT:], "self_check": self.self_check, "cancel_requested": self.cancel_requested,
            "lease_released": self.released, "paid": self.paid,
        }


TASKS: dict[str, Task] = {}
_tasks_lock = threading.Lock()


def snapshot(task: Task) -> dict[str, Any]:
    """A new revision of the task's state, on disk (atomically) and as a receipt. A
    terminal state goes to ``terminal.json``; only then is the running marker removed."""
    with task.lock:
        task.revision += 1
        record = task.record()
        folder = task_dir(task.id)
        if task.finished:
            write_atomic(folder / "terminal.json", record)
            with contextlib.suppress(FileNotFoundError):
                (folder / "running").unlink()
        else:
            write_atomic(folder / "state.json", record)
    return record


def set_state(task: Task, state: str, *, error: tuple[str, str] | None = None, summary: str | None = None) -> None:
    """A new state; a terminal one is written by ``finish`` once the phone is released."""
    with task.lock:
        task.state = state
        if error is not None:
            task.error = error
        if summary is not None:
            task.summary = summary
    if state not in TERMINAL_STATES:
        snapshot(task)


def task_receipt(record: dict[str, Any], *, live: bool = True) -> dict[str, Any]:
    """The receipt of one snapshot. Running → running; at the checkout with an intent →
    succeeded (the checkout was read back; payments records it); done → succeeded; a
    timeout → unknown (what the phone did last is not known); cancelled → cancelled;
    CheckoutStop or any failure → failed."""
    task_id, revision, state = record["task_id"], record["revision"], record["state"]
    target = f"{record['device_id']}/{record['app'] or 'home'}"
    content = {k: record[k] for k in ("state", "goal", "kind", "app", "device_id", "steps", "max_steps", "summary", "self_check", "lease_released", "cancel_requested")}
    steps_value = [value("steps", record["steps"], "step", "the phone task")]
    error = record.get("error") or {}
    if not live and state not in TERMINAL_STATES:
        return receipt("unknown", summary=f"task {task_id} was {state} when its worker was lost; check the phone", content=content,
                       error=("TASK_LOST", "the pack's host restarted while the task ran"), retry="after_check", check_with="read_screen",
                       unknowns=["what the phone did after the last step"], task_id=task_id, revision=revision)
    if state in RUNNING_STATES:
        return receipt("running", summary=f"task {task_id}: {state}, step {record['steps']} of {record['max_steps']}", content=content,
                       values=steps_value, check_with="task_status", task_id=task_id, revision=revision)
    if state == "awaiting_payment":
        view = record["checkout"] or {}
        content.update(view)
        content["payment_intent_id"] = record["payment_intent_id"]
        values = [value("checkout_amount", view.get("amount", ""), "yuan", SOURCE_PAGE)] if view.get("amount") else []
        return receipt("succeeded", summary=f"stopped at the checkout of {view.get('merchant', '')}: {view.get('amount', '?')} yuan to "
                       f"{view.get('payee', '')}; waiting for the payment flow", content=content, values=values + steps_value,
                       effects=[effect(f"{target}/checkout", "stopped_at_checkout", "verified")], task_id=task_id, revision=revision)
    if state == "succeeded":
        if record.get("paid"):
            paid = record["paid"]
            content.update(paid)
            return receipt("succeeded", summary=f"paid {paid['amount']} yuan to {paid['payee']}", content=content,
                           values=[value("checkout_amount", paid["amount"], "yuan", SOURCE_PAGE), value("authorized_amount", paid["amount"], "yuan", "the owner's authorization")],
                           effects=[effect(paid["payee"], "paid", "verified")], task_id=task_id, revision=revision)
        return receipt("succeeded", summary=f"task {task_id} done in {record['steps']} steps: {record['summary']}", content=content,
                       values=steps_value, effects=[effect(target, f"errand:{record['kind']}", "service_ack")], task_id=task_id, revision=revision)
    if state == "cancelled":
        return receipt("cancelled", summary=f"task {task_id} cancelled after {record['steps']} steps; the phone was released", content=content,
                       values=steps_value, task_id=task_id, revision=revision)
    if state == "timed_out":
        return receipt("unknown", summary=f"task {task_id} ran out of time after {record['steps']} steps", content=content, values=steps_value,
                       error=(error.get("code", "MODEL_PHASE_TIMEOUT"), error.get("message", "")), retry="after_check", check_with="read_screen",
                       unknowns=["whether the errand is complete"], task_id=task_id, revision=revision)
    if state == "refused":
        if record.get("checkout"):
            content.update(record["checkout"])
        return receipt("failed", summary=f"task {task_id} stopped before the checkout: there is no payment intent", content=content,
                       values=steps_value, error=(error.get("code", "checkout_without_intent"), error.get("message", "")), retry="forbidden",
                       task_id=task_id, revision=revision)
    code = error.get("code", "failed")
    lost = "TIMEOUT" in code.upper() or "DISCONNECTED" in code.upper()
    return receipt("unknown" if lost else "failed", summary=f"task {task_id} failed: {error.get('message', '')}", content=content,
                   values=steps_value, error=(code, error.get("message", "")), retry="after_check" if lost else "forbidden",
                   check_with="read_screen" if lost else None, task_id=task_id, revision=revision)


def _screen(task: Task) -> dict[str, Any]:
    assert task.lease is not None and task.lease.lease_id is not None
    return phone("GET", f"/v1/leases/{task.lease.lease_id}/screen")["screen"]


def _act(task: Task, action: dict[str, Any]) -> dict[str, Any]:
    assert task.lease is not None
    lease = task.lease.lease_id
    if action["action"] == "tap":
        return phone("POST", f"/v1/leases/{lease}/tap", {"node": action["node"]})["screen"]
    if action["action"] == "input":
        return phone("POST", f"/v1/leases/{lease}/input", {"node": action["node"], "text": action["text"]})["screen"]
    return phone("POST", f"/v1/leases/{lease}/launch", {"app": action["app"]})["screen"]


def _messages(task: Task, screen: dict[str, Any], note: str) -> list[dict[str, Any]]:
    user = {
        "goal": task.goal, "app": task.app, "step": task.steps + 1, "max_steps": task.max_steps,
        "screen": screen, "earlier_actions": task.history[-HISTORY_KEPT:],
    }
    if note:
        user["note"] = note
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": json.dumps(user, ensure_ascii=False)}]


def _stop_at_checkout(task: Task, screen: dict[str, Any]) -> None:
    view = checkout_view(screen)
    with task.lock:
        task.checkout = view
    if task.payment_intent_id:
        set_state(task, "awaiting_payment", summary="stopped at the checkout; the payment flow takes over in the same lease")
    else:
        set_state(task, "refused", error=("checkout_without_intent", "the step would enter the checkout, and this task has no payment intent; "
                                         "report the merchant, items, amount and ETA to the owner"))


def model_loop(task: Task) -> None:
    """Steps until done, fail, CheckoutStop, the step limit, the time limit or a cancel."""
    deadline = clock() + task.model_phase_seconds
    note, bad = "", 0
    while True:
        if task.cancel.is_set():
            set_state(task, "cancelled")
            return
        if task.steps >= task.max_steps:
            set_state(task, "failed", error=("step_limit", f"the goal was not reached within {task.max_steps} steps"))
            return
        if clock() >= deadline:
            set_state(task, "timed_out", error=("MODEL_PHASE_TIMEOUT", f"the model phase took more than {task.model_phase_seconds:g} s"))
            return
        screen = _screen(task)
        if at_checkout(screen):
            _stop_at_checkout(task, screen)
            return
        answer = ask_model(_messages(task, screen, note), min(MODEL_TIMEOUT_SECONDS, max(1.0, deadline - clock())))
        if task.cancel.is_set():
            set_state(task, "cancelled")
            return
        if clock() >= deadline:  # the answer came too late: not applied
            set_state(task, "timed_out", error=("MODEL_PHASE_TIMEOUT", f"the model phase took more than {task.model_phase_seconds:g} s"))
            return
        task.steps += 1
        action = parse_action(answer)
        if action is None:
            bad += 1
            note = "your last answer was not one JSON action; answer with exactly one"
            if bad >= MAX_BAD_ANSWERS:
                set_state(task, "failed", error=("model_bad_action", f"{bad} answers in a row were not an action"))
                return
            snapshot(task)
            continue
        bad, note = 0, ""
        if action["action"] == "done":
            set_state(task, "succeeded", summary=action["text"])
            return
        if action["action"] == "fail":
            set_state(task, "failed", error=("model_gave_up", action["text"] or "the model could not reach the goal"))
            return
        verdict = checkout_stop(action, screen, task.payment_intent_id)
        if verdict != "go":
            _stop_at_checkout(task, screen)
            return
        try:
            screen = _act(task, action)
        except PhoneRefused as exc:
            if exc.code not in ("no_such_node", "no_such_app"):
                raise
            note = f"that action failed: {exc.code}"
        task.history.append({k: action[k] for k in ("action", "node", "app") if k in action})
        if at_checkout(screen):  # a step that led into a checkout: stop there, whatever the model thinks
            _stop_at_checkout(task, screen)
            return
        snapshot(task)


def self_check(task: Task) -> None:
    """One read-only look at the phone after a failure the owner did not cause: the screen
    read once (no tap, no input), recorded with the task. Never re-runs the task."""
    if task.self_check is not None or task.lease is None or task.lease.lease_id is None:
        return
    try:
        screen = _screen(task)
        task.self_check = {"read_only": True, "page": screen.get("page", ""), "app": screen.get("app", ""), "title": screen.get("title", ""),
                           "at_checkout": at_checkout(screen)}
    except (PhoneRefused, PhoneLost) as exc:
        task.self_check = {"read_only": True, "error": exc.code}


def run_task(task: Task) -> None:
    """The worker: lease, precheck, prepare, model loop, end (self-check, release)."""
    try:
        set_state(task, "leasing")
        task.lease = Lease(task.device_id, task.id)
        task.lease.acquire()
        set_state(task, "prechecking")
        devices = {d["id"]: d for d in phone("GET", "/v1/devices")["devices"]}
        if devices.get(task.device_id, {}).get("state") != "running":
            raise PhoneRefused("device_stopped", f"{task.device_id} is not running (start it first)")
        _screen(task)
        set_state(task, "preparing")
        phone("POST", f"/v1/leases/{task.lease.lease_id}/home")
        if task.app:
            _act(task, {"action": "launch", "app": task.app})
        set_state(task, "running")
        model_loop(task)
    except PhoneLost as exc:
        set_state(task, "failed", error=(exc.code, str(exc)))
    except PhoneRefused as exc:
        set_state(task, "failed", error=(exc.code, str(exc)))
    except Exception as exc:  # noqa: BLE001 - a worker must always end its task
        set_state(task, "failed", error=("internal_error", type(exc).__name__))
    finally:
        if task.state == "awaiting_payment" and not task.cancel.is_set():
            task.done.set()  # the lease stays for the payment flow
        else:
            finish(task)


def finish(task: Task) -> None:
    """End of a task: a self-check if it failed without the owner cancelling, then the
    phone released (after the last tap or input returned), then the terminal state."""
    with task.lock:
        if task.state in ("awaiting_payment", *RUNNING_STATES):
            task.state = "cancelled"
        if task.state in ("failed", "timed_out") and not task.cancel_requested:
            self_check(task)
        if task.lease is not None:
            task.released = task.lease.release()
            task.lease = None
        task.finished = True
    snapshot(task)
    task.done.set()


# --- arguments ---------------------------------------------------------------------------------

KINDS = ("errand", "order", "message", "account", "ride", "delete")
START_SCHEMA = {
    "type": "object",
    "properties": {
        "goal": {"type": "string", "minLength": 1, "maxLength": 1000, "description": "what to do on the phone, in the owner's words"},
        "kind": {"type": "string", "enum": list(KINDS), "description": "errand/order: browse or fill a cart (an order stops at the checkout); "
                 "message: sends to someone; account: logs in or changes an account; ride: a physical action; delete: deletes something"},
        "app": {"type": "string", "maxLength": 64, "description": "the app to open first (optional)"},
        "device_id": {"type": "string", "maxLength": 64, "description": "which phone (default: the first free running one)"},
        "max_steps": {"type": "integer", "minimum": MIN_STEPS, "maximum": MAX_STEPS, "default": DEFAULT_STEPS},
        "model_phase_seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": MODEL_PHASE_SECONDS, "default": MODEL_PHASE_SECONDS},
        "wait_seconds": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_SECONDS, "default": START_WAIT_SECONDS},
    },
    "required": ["goal", "kind"],
}
TASK_SCHEMA = {"type": "object", "properties": {"task_id": {"type": "string", "maxLength": 64}}, "required": ["task_id"]}
CONTROL_SCHEMA = {
    "type": "object",
    "properties": {
        "task_id": {"type": "string", "maxLength": 64},
        "action": {"type": "string", "enum": ["cancel", "pay"]},
        "wait_seconds": {"type": "number", "minimum": 0, "maximum": CLEANUP_WAIT_SECONDS, "default": CLEANUP_WAIT_SECONDS},
    },
    "required": ["task_id", "action"],
}
DEVICE_SCHEMA = {"type": "object", "properties": {"device_id": {"type": "string", "minLength": 1, "maxLength": 64}}, "required": ["device_id"]}
POWER_SCHEMA = {
    "type": "object",
    "properties": {"device_id": {"type": "string", "minLength": 1, "maxLength": 64}, "action": {"type": "string", "enum": ["start", "stop"]}},
    "required": ["device_id", "action"],
}
LOGIN_SCHEMA = {
    "type": "object",
    "properties": {
        "device_id": {"type": "string", "minLength": 1, "maxLength": 64}, "app": {"type": "string", "minLength": 1, "maxLength": 64},
        "snapshot_id": {"type": "string", "maxLength": 64, "description": "restore only: the id save_login returned"},
    },
    "required": ["device_id", "app"],
}
NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def invalid(message: str) -> dict[str, Any]:
    return receipt("failed", error=("invalid_request", message), retry="forbidden")


def failure(exc: PhoneRefused | PhoneLost) -> dict[str, Any]:
    if isinstance(exc, PhoneLost):
        return receipt("unknown", error=(exc.code, str(exc)), retry="after_check", unknowns=["what the phone service did"])
    return receipt("failed", error=(exc.code, str(exc)), retry="forbidden")


def start_arguments(args: dict[str, Any]) -> dict[str, Any] | str:
    """The task's settings, or why they are refused (nothing is started then)."""
    goal, kind = args.get("goal"), args.get("kind")
    if not isinstance(goal, str) or not goal.strip() or len(goal) > 1000:
        return "goal must be 1 to 1000 characters"
    if kind not in KINDS:
        return f"kind must be one of {', '.join(KINDS)}"
    steps = args.get("max_steps", DEFAULT_STEPS)
    if isinstance(steps, bool) or not isinstance(steps, int) or not MIN_STEPS <= steps <= MAX_STEPS:
        return f"max_steps must be an integer from {MIN_STEPS} to {MAX_STEPS}"
    phase = args.get("model_phase_seconds", MODEL_PHASE_SECONDS)
    if isinstance(phase, bool) or not isinstance(phase, (int, float)) or not 0 < phase <= MODEL_PHASE_SECONDS:
        return f"model_phase_seconds must be above 0 and at most {MODEL_PHASE_SECONDS:g}"
    wait = args.get("wait_seconds", START_WAIT_SECONDS)
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= MAX_WAIT_SECONDS:
        return f"wait_seconds must be from 0 to {MAX_WAIT_SECONDS:g}"
    app, device = args.get("app") or "", args.get("device_id") or ""
    if not isinstance(app, str) or (app and not NAME.match(app)) or not isinstance(device, str) or (device and not NAME.match(device)):
        return "app and device_id are names of letters, digits, dot, dash and underscore"
    intent = args.get("payment_intent_id") or ""
    return {"goal": goal.strip(), "kind": kind, "max_steps": steps, "model_phase_seconds": float(phase), "wait": float(wait),
            "app": app, "device_id": device, "intent": str(intent)}


def _free_device(wanted: str) -> str:
    devices = phone("GET", "/v1/devices")["devices"]
    for d in devices:
        if (d["id"] == wanted) if wanted else (d.get("state") == "running" and not d.get("leased")):
            return str(d["id"])
    raise PhoneRefused("no_such_device" if wanted else "no_free_device", f"no device {wanted}" if wanted else "no running phone is free")


# --- tools -------------------------------------------------------------------------------------


@TOOLS("Start an errand on a cloud phone: lease, precheck, prepare, then the model loop (80 steps by default, 1-120).", START_SCHEMA)
def start_task(args: dict[str, Any]) -> dict[str, Any]:
    settings = start_arguments(args)
    if isinstance(settings, str):
        return invalid(settings)
    key = str(args.get("idempotency_key") or uuid.uuid4().hex)
    task_id = "pt-" + hashlib.sha256(key.encode()).hexdigest()[:24]
    with _tasks_lock:
        task = TASKS.get(task_id)
        if task is None:
            existing = read_record(task_id)
            if existing is not None:  # started before this host (re)started
                return task_receipt(existing, live=existing["state"] in TERMINAL_STATES)
            try:
                device = _free_device(settings["device_id"])
            except (PhoneRefused, PhoneLost) as exc:
                return failure(exc)
            task = Task(task_id, settings["goal"], settings["kind"], settings["app"], device, settings["max_steps"],
                        settings["model_phase_seconds"], settings["intent"])
            TASKS[task_id] = task
            task_dir(task_id).mkdir(parents=True, exist_ok=True)
            (task_dir(task_id) / "running").touch()
            snapshot(task)
            capability = getattr(packkit._current, "capability", None)
            worker = threading.Thread(target=packkit.run_with_capability, args=(lambda _a: run_task(task), {}, capability),
                                      name=f"phone-{task_id}", daemon=True)
            worker.start()
    task.done.wait(settings["wait"])  # an early end (or the checkout) comes back in this receipt
    return task_receipt(snapshot(task))


@TOOLS("Read a phone task's state (a receipt with the task id and a new revision).", TASK_SCHEMA)
def task_status(args: dict[str, Any]) -> dict[str, Any]:
    task_id = str(args.get("task_id", ""))
    task = TASKS.get(task_id)
    if task is not None:
        return task_receipt(snapshot(task))
    record = read_record(task_id)
    if record is None:
        return receipt("failed", error=("not_found", f"no phone task {task_id[:64]}"), retry="forbidden")
    return task_receipt(record, live=record["state"] in TERMINAL_STATES)


@TOOLS("Control a phone task: cancel it (stops the workflow, waits for cleanup, releases the phone), or pay at its checkout "
       "with the owner's authorization (the platform supplies it).", CONTROL_SCHEMA)
def task_control(args: dict[str, Any]) -> dict[str, Any]:
    task = TASKS.get(str(args.get("task_id", "")))
    action = args.get("action")
    if action not in ("cancel", "pay"):
        return invalid("action must be cancel or pay")
    if task is None:
        return receipt("failed", error=("not_found", "no running phone task with that id"), retry="forbidden")
    if action == "pay":
        return pay(task, args)
    wait = args.get("wait_seconds", CLEANUP_WAIT_SECONDS)
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= CLEANUP_WAIT_SECONDS:
        return invalid(f"wait_seconds must be from 0 to {CLEANUP_WAIT_SECONDS:g}")
    with task.lock:
        if task.finished:
            return task_receipt(snapshot(task))
        if task.state not in TERMINAL_STATES:  # an end already decided is not the owner's cancel
            task.cancel_requested = True
            task.cancel.set()
        awaiting = task.state == "awaiting_payment"
    if awaiting:  # the worker has ended; the lease waits for the payment flow
        finish(task)
    task.done.wait(float(wait))  # the step in flight finishes, then the worker releases the phone
    return task_receipt(snapshot(task))


def pay(task: Task, args: dict[str, Any]) -> dict[str, Any]:
    """Tap the pay control at the task's checkout, with the owner's authorization: the
    amount on the page is read again and must equal the authorized amount."""
    intent, authorization, authorized = args.get("payment_intent_id"), args.get("payment_authorization_id"), args.get("authorized_amount")
    with task.lock:
        if task.state != "awaiting_payment" or task.lease is None:
            return receipt("failed", error=("not_at_checkout", f"task {task.id} is {task.state}, not waiting at a checkout"), retry="forbidden")
        if not intent or str(intent) != task.payment_intent_id or not authorization or authorized in (None, ""):
            return receipt("failed", error=("no_authorization", "paying needs this task's payment intent and the owner's authorization"), retry="forbidden")
        try:
            screen = _screen(task)
            view = checkout_view(screen)
            if not at_checkout(screen) or not view["amount"]:
                return receipt("failed", error=("not_at_checkout", "the phone is no longer on the checkout page"), retry="forbidden")
            want = Decimal(str(authorized)).quantize(Decimal("0.01"))
            if Decimal(view["amount"]) != want:
                return receipt("failed", error=("AMOUNT_CHANGED", f"the checkout says {view['amount']}, the authorization {want}"), retry="forbidden",
                               values=[value("checkout_amount", view["amount"], "yuan", SOURCE_PAGE), value("authorized_amount", str(want), "yuan", "the owner's authorization")])
            control = next(n for n in screen["nodes"] if is_payment_control(n))
            after = phone("POST", f"/v1/leases/{task.lease.lease_id}/tap", {"node": control["id"]})["screen"]
        except PhoneLost as exc:
            return receipt("unknown", error=(exc.code, str(exc)), retry="after_check", check_with="task_status", unknowns=["whether the payment went through"])
        except (PhoneRefused, InvalidOperation, StopIteration) as exc:
            return receipt("failed", error=(getattr(exc, "code", "pay_failed"), str(exc) or "the pay control could not be used"), retry="forbidden")
        if at_checkout(after):
            return receipt("unknown", error=("payment_unconfirmed", "the checkout page is still shown after the tap"), retry="after_check",
                           check_with="task_status", unknowns=["whether the payment went through"])
        task.paid = {"amount": view["amount"], "payee": view["payee"], "merchant": view["merchant"], "page": after.get("title", "")}
        task.state = "succeeded"
    finish(task)
    return task_receipt(snapshot(task))


@TOOLS("List the cloud phones: id, running or stopped, leased or free.")
def devices(args: dict[str, Any]) -> dict[str, Any]:
    try:
        listed = phone("GET", "/v1/devices")["devices"]
    except (PhoneRefused, PhoneLost) as exc:
        return failure(exc)
    items = [{"id": str(d["id"]), "state": str(d["state"]), "leased": bool(d.get("leased"))} for d in listed]
    return receipt("succeeded", summary=", ".join(f"{d['id']}: {d['state']}{' (leased)' if d['leased'] else ''}" for d in items) or "no phones",
                   content={"items": items})


@TOOLS("Start or stop (shut down) a cloud phone.", POWER_SCHEMA)
def power(args: dict[str, Any]) -> dict[str, Any]:
    device, action = args.get("device_id"), args.get("action")
    if not isinstance(device, str) or not NAME.match(device) or action not in ("start", "stop"):
        return invalid("device_id is a name and action start or stop")
    try:
        answer = phone("POST", f"/v1/devices/{device}/{action}")["device"]
    except (PhoneRefused, PhoneLost) as exc:
        return failure(exc)
    state = str(answer.get("state"))
    return receipt("succeeded", summary=f"{device}: {state}", content={"device_id": device, "state": state},
                   effects=[effect(device, action, "service_ack")])


@contextlib.contextmanager
def _short_lease(device: str, holder: str) -> Any:
    lease = Lease(device, holder)
    lease.acquire()
    try:
        yield lease
    finally:
        lease.release()


@TOOLS("Read the current screen of a cloud phone (read only: nothing is tapped).", DEVICE_SCHEMA)
def read_screen(args: dict[str, Any]) -> dict[str, Any]:
    device = args.get("device_id")
    if not isinstance(device, str) or not NAME.match(device):
        return invalid("device_id is a name")
    try:
        with _short_lease(device, "read_screen") as lease:
            screen = phone("GET", f"/v1/leases/{lease.lease_id}/screen")["screen"]
    except (PhoneRefused, PhoneLost) as exc:
        return failure(exc)
    texts = [str(n.get("text", "")) for n in screen.get("nodes", [])]
    return receipt("succeeded", summary=f"{device}: {screen.get('title', '')}",
                   content={"device_id": device, "app": screen.get("app", ""), "page": screen.get("page", ""), "title": screen.get("title", ""),
                            "at_checkout": at_checkout(screen), "items": texts})


def _login(args: dict[str, Any], verb: str) -> dict[str, Any]:
    device, app, snapshot_id = args.get("device_id"), args.get("app"), args.get("snapshot_id")
    if not isinstance(device, str) or not NAME.match(device) or not isinstance(app, str) or not NAME.match(app):
        return invalid("device_id and app are names")
    if verb == "restore" and (not isinstance(snapshot_id, str) or not NAME.match(snapshot_id)):
        return invalid("restore needs the snapshot_id that save_login returned")
    try:
        with _short_lease(device, f"login_{verb}") as lease:
            body = {"snapshot_id": snapshot_id} if verb == "restore" else None
            answer = phone("POST", f"/v1/leases/{lease.lease_id}/apps/{app}/login/{verb}", body)
    except (PhoneRefused, PhoneLost) as exc:
        return failure(exc)
    if verb == "save":
        return receipt("succeeded", summary=f"saved the login data of {app} on {device}: {answer['snapshot_id']}",
                       content={"device_id": device, "app": app, "snapshot_id": str(answer["snapshot_id"])},
                       values=[value("size", int(answer.get("bytes", 0)), "byte", "the phone service")],
                       effects=[effect(f"{device}/{app}", "login_saved", "service_ack")])
    return receipt("succeeded", summary=f"restored the login data of {app} on {device}", content={"device_id": device, "app": app, "snapshot_id": snapshot_id},
                   effects=[effect(f"{device}/{app}", "login_restored", "service_ack")])


@TOOLS("Save an app's login data on a cloud phone (the owner's data), to restore it later.", LOGIN_SCHEMA)
def save_login(args: dict[str, Any]) -> dict[str, Any]:
    return _login(args, "save")


@TOOLS("Restore an app's login data saved earlier (save_login's snapshot_id) on a cloud phone.", LOGIN_SCHEMA)
def restore_login(args: dict[str, Any]) -> dict[str, Any]:
    return _login(args, "restore")
