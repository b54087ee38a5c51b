"""The one seam upward: how code below ``devices/`` reaches a device, or starts work that
lives in a layer above it (docs/architecture.md, "Seams"; docs/conventions.md).

Like Zulip's ``send_event``: a service never imports a consumer. It hands a frame to
``to_device`` or ``to_owner`` (``*_sync`` from synchronous code), which send it on the
channel layer to the group the device consumers joined; the consumers deliver it. The group
names are made here and nowhere else (``device_group``, ``owner_group``: the consumers join
them, a guest device joins only its own).

Two answers only a higher layer has are registered when Django starts
(``AppConfig.ready``), so that no lower layer imports it:

- which of the owner's devices a card goes to: ``owner_devices`` (devices/ registers
  ``register_device_chooser``); ``to_owner_devices_sync`` pushes a card to them;
- how to start work that runs above the caller (a payment whose authorization was given
  at once, which brain/ executes): ``start_after_commit`` with the Celery task's name,
  whichever way brain/ runs it (a worker, or the web server's own loop); brain/ registers
  ``register_starter``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction

DeviceChooser = Callable[[int, tuple[str, ...]], list[Any]]

_device_chooser: DeviceChooser | None = None
_starters: dict[str, Callable[..., None]] = {}


def device_group(device_id: Any) -> str:
    """The channel group of one device's sockets."""
    return f"device.{device_id}"


def owner_group(owner_id: int) -> str:
    """The channel group of the owner's devices (guest devices are not in it)."""
    return f"owner.{owner_id}"


async def to_device(device_id: Any, frame: dict[str, Any]) -> None:
    """Send ``frame`` to every open socket of one device."""
    await get_channel_layer().group_send(device_group(device_id), frame)


async def to_owner(owner_id: int, frame: dict[str, Any]) -> None:
    """Send ``frame`` to every open socket of the owner's devices."""
    await get_channel_layer().group_send(owner_group(owner_id), frame)


def timeline_new(seq: int, *, known_to_socket: str | None = None, known_to_device: Any = None) -> dict[str, Any]:
    """The ``timeline.new`` hint for ``seq``, for ``to_owner``. A socket that was told
    ``seq`` already is not sent it (its consumer drops it): ``known_to_socket``, the channel
    of the socket whose ``text.ack``/``image.ack`` carried it, and ``known_to_device``, the
    device whose sockets got the ``reply.done``/``notice`` that carried it. Only the hint
    itself is spared: merged with another (``yimi_project.infra.channel_layers``), it goes to
    every socket."""
    message: dict[str, Any] = {"type": "timeline.new", "seq": seq}
    if known_to_socket is not None:
        message["known_to_socket"] = known_to_socket
    if known_to_device is not None:
        message["known_to_device"] = str(known_to_device)
    return message


async def to_device_then_owner(
    device_id: Any, frame: dict[str, Any], owner_id: int, owner_frame: dict[str, Any], *, before: dict[str, Any] | None = None
) -> None:
    """``to_device(device_id, frame)`` then ``to_owner(owner_id, owner_frame)``, in one
    round trip where the channel layer can (``group_send_many``): a reply's end and its
    ``timeline.new``. ``before``: a frame for the device ahead of ``frame`` in the same
    trip (the reply's last chunk, ``ReplyChunks.last``)."""
    layer = get_channel_layer()
    first = [(device_group(device_id), before)] if before is not None else []
    sends = [*first, (device_group(device_id), frame), (owner_group(owner_id), owner_frame)]
    many = getattr(layer, "group_send_many", None)
    if many is not None:
        await many(sends)
        return
    for group, message in sends:
        await layer.group_send(group, message)


def _send_sync(group: str, frame: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(group, frame)


def to_device_sync(device_id: Any, frame: dict[str, Any]) -> None:
    """``to_device`` from synchronous code (services, Celery tasks)."""
    _send_sync(device_group(device_id), frame)


def to_owner_sync(owner_id: int, frame: dict[str, Any]) -> None:
    """``to_owner`` from synchronous code (services, Celery tasks)."""
    _send_sync(owner_group(owner_id), frame)


def announce_sync(owner_id: int, *, seq: int, code: str, text: str, notice_id: str | None = None) -> None:
    """A notice the platform wrote on its own (a reminder, a watch, a release, a full hot
    store: no run, no request it answers), to every device of the owner: the ``notice`` frame,
    then the ``timeline.new`` hint. Call it after the entry is committed; a failed send raises
    (the entry stays on the timeline and devices catch up with ``sync``; the caller logs it)."""
    frame: dict[str, Any] = {"type": "notice", "seq": seq, "code": code, "text": text, "run_id": None, "reply_to_seq": None}
    if notice_id is not None:
        frame["notice_id"] = notice_id
    to_owner_sync(owner_id, frame)
    to_owner_sync(owner_id, {"type": "timeline.new", "seq": seq})


# --- reply chunks, batched by time ------------------------------------------------------


class ReplyChunks:
    """The ``reply.chunk`` frames of one reply on their way to the device that spoke,
    batched by time: at most one channel message per ``window`` seconds
    (``REPLY_CHUNK_WINDOW_SECONDS``, 20 ms) for this reply.

    Steps: 1. the first text goes out at once, so the first chunk is never later than it
    was; 2. text that comes within ``window`` of the last message waits, joined to what
    else comes, and goes out as one frame when the window ends; 3. ``last`` (the reply
    ended) ends the waiting and hands what waits, after any message already on its way,
    to the caller as the last frame, which goes in the same channel message as
    ``reply.done`` (or alone, ``send_last``). ``index`` counts the frames (0, 1, ...); their
    texts join to exactly the texts added, in order. ``clock`` and ``sleep`` are the one
    time source (tests pass their own).
    """

    def __init__(
        self,
        device_id: Any,
        frame: dict[str, Any],
        *,
        window: float | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        send: Callable[[Any, dict[str, Any]], Awaitable[None]] | None = None,
    ) -> None:
        self.device_id = device_id
        self.frame = {"type": "reply.chunk", **frame}
        self.window = settings.REPLY_CHUNK_WINDOW_SECONDS if window is None else window
        self.clock = clock or (lambda: asyncio.get_running_loop().time())
        self.sleep = sleep or asyncio.sleep
        self.send = send or to_device
        self.pending = ""
        self.index = 0
        self.last_sent: float | None = None
        self._due: asyncio.Task[None] | None = None  # waiting for the window to end
        self._flushing: set[asyncio.Task[None]] = set()  # windows that ended, sending
        self._lock = asyncio.Lock()  # one message at a time, in order

    async def add(self, text: str) -> None:
        if not text:
            return
        self.pending += text
        if self._due is not None:
            return  # a message is already due at the end of the window
        wait = 0.0 if self.last_sent is None else self.last_sent + self.window - self.clock()
        if wait <= 0:
            await self._flush()
        else:
            self._due = asyncio.ensure_future(self._flush_after(wait))

    async def _flush_after(self, wait: float) -> None:
        await self.sleep(wait)
        self._due = None
        task = asyncio.current_task()
        if task is not None:
            self._flushing.add(task)
        try:
            await self._flush()
        finally:
            self._flushing.discard(task)  # type: ignore[arg-type]

    async def _flush(self) -> None:
        async with self._lock:
            frame = self._take()
            if frame is not None:
                await self.send(self.device_id, frame)

    def _take(self) -> dict[str, Any] | None:
        """The frame of the text waiting, numbered; None when none waits."""
        if not self.pending:
            return None
        text, self.pending = self.pending, ""
        index, self.index = self.index, self.index + 1
        self.last_sent = self.clock()
        return {**self.frame, "index": index, "text": text}

    async def send_last(self, frame: dict[str, Any] | None) -> None:
        """Send the frame ``last`` returned on its own (None: nothing)."""
        if frame is not None:
            async with self._lock:
                await self.send(self.device_id, frame)

    async def last(self) -> dict[str, Any] | None:
        """The reply ended: every chunk but the last is out when this returns, and the last
        (the text still waiting, None if none) is returned instead of sent, for the caller
        to send in one message with what ends the reply (``to_device_then_owner``'s
        ``before``: one channel message per reply fewer)."""
        due, self._due = self._due, None
        if due is not None:
            due.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await due
        if self._flushing:  # a window that ended is sending: after it, in order
            for outcome in await asyncio.gather(*self._flushing, return_exceptions=True):
                if isinstance(outcome, Exception):
                    raise outcome  # as a chunk sent at once would have raised to the caller
        async with self._lock:
            return self._take()


# --- which devices -----------------------------------------------------------------------


def register_device_chooser(chooser: DeviceChooser) -> None:
    """accounts/ answers ``owner_devices`` (``AccountsConfig.ready``)."""
    global _device_chooser
    _device_chooser = chooser


def owner_devices(owner_id: int, kinds: tuple[str, ...]) -> list[Any]:
    """Ids of the owner's active, non-guest devices of ``kinds`` (``Device.Kind`` values);
    all of them if none is of those kinds, so a card is never addressed to nobody."""
    if _device_chooser is None:
        raise RuntimeError("no device chooser registered: the accounts app is not installed")
    return _device_chooser(owner_id, kinds)


def to_owner_devices_sync(owner_id: int, kinds: tuple[str, ...], frame: dict[str, Any]) -> None:
    """Send ``frame`` to each of ``owner_devices(owner_id, kinds)``."""
    for device_id in owner_devices(owner_id, kinds):
        to_device_sync(device_id, frame)


# --- starting work above -----------------------------------------------------------------


def register_starter(task_name: str, starter: Callable[..., None]) -> None:
    """The layer that runs the Celery task ``task_name`` says how to start it now."""
    _starters[task_name] = starter


def start_after_commit(task_name: str, *args: Any, **kwargs: Any) -> None:
    """Start the work of the Celery task ``task_name`` once the current transaction
    commits (at once outside one). Raises, inside the caller's transaction, if no layer
    registered it: work that would never start must not be recorded as started."""
    starter = _starters.get(task_name)
    if starter is None:
        raise RuntimeError(f"nothing registered to start {task_name}")
    transaction.on_commit(lambda: starter(*args, **kwargs))
