"""Delivery to devices under load (issue 14): reply chunks batched by time, no frame lost
without a trace, a device recovers what it missed with ``sync``, and the recovery sweep
never puts more run messages on the queue than there are runs waiting."""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection
from django.utils import timezone

from brain.models import Run
from brain.recovery import recover_runs, runs_on_queue
from brain.services import accept_utterance
from schedules.reminders import create_reminder, fire_due_reminders
from tests.conftest import db_async, need, new_client_id, open_socket, receive_until
from tests.support.process_support import publishing_to, redis_prefix
from yimi_project import push
from yimi_project.infra.channel_layers import SocketInbox

pytestmark = pytest.mark.django_db(transaction=True)


class Recorded(logging.Handler):
    """The ``yimi`` logger's events (it does not propagate to pytest's capture)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [getattr(r, "yimi_fields", {}) for r in self.records if r.getMessage() == name]


@pytest.fixture
def events() -> Any:
    import yimi_project.asgi  # noqa: F401  (its django.setup() configures logging again: before we listen)

    handler = Recorded()
    logger = logging.getLogger("yimi")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


# --- reply chunks, batched by time --------------------------------------------------------


class ManualClock:
    """The batcher's clock and sleep: time moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sleepers.append((self.now + seconds, done))
        await done

    async def advance(self, seconds: float) -> None:
        for _ in range(5):  # tasks just made start (and begin their sleep) before time moves
            await asyncio.sleep(0)
        self.now += seconds
        for due, done in list(self.sleepers):
            if due <= self.now + 1e-9 and not done.done():  # float sums: 0.005 + 0.015 may exceed 0.02
                done.set_result(None)
        for _ in range(5):  # let the woken flush run to its send
            await asyncio.sleep(0)


def batcher(clock: ManualClock, sent: list[tuple[float, dict[str, Any]]]) -> push.ReplyChunks:
    async def send(device_id: Any, frame: dict[str, Any]) -> None:
        sent.append((clock.time(), frame))

    return push.ReplyChunks("dev", {"run_id": "r", "reply_to_seq": 7}, window=0.02, clock=clock.time, sleep=clock.sleep, send=send)


async def test_the_first_chunk_goes_at_once_and_later_ones_wait_for_the_window() -> None:
    clock, sent = ManualClock(), []
    chunks = batcher(clock, sent)
    await chunks.add("Hello. ")
    assert [f["text"] for _, f in sent] == ["Hello. "]  # no wait for the first
    await clock.advance(0.005)
    await chunks.add("How ")
    await clock.advance(0.005)
    await chunks.add("are you? ")
    assert len(sent) == 1  # both wait inside the window
    await clock.advance(0.010)  # the window since the first message ends
    assert [f["text"] for _, f in sent] == ["Hello. ", "How are you? "]
    assert sent[1][0] - sent[0][0] >= 0.02


async def test_at_most_one_message_per_window_and_the_frames_join_to_the_whole_reply() -> None:
    clock, sent = ManualClock(), []
    chunks = batcher(clock, sent)
    deltas = [f"part {i}. " for i in range(40)]
    for delta in deltas:  # a delta every 3 ms
        await chunks.add(delta)
        await clock.advance(0.003)
    await chunks.send_last(await chunks.last())
    frames = [f for _, f in sent]
    assert "".join(f["text"] for f in frames) == "".join(deltas)
    assert [f["index"] for f in frames] == list(range(len(frames)))
    assert all(f["type"] == "reply.chunk" and f["run_id"] == "r" and f["reply_to_seq"] == 7 for f in frames)
    times = [t for t, _ in sent[:-1]]  # the last one is sent at the reply's end
    assert all(b - a >= 0.02 - 1e-9 for a, b in zip(times, times[1:]))
    assert len(frames) < len(deltas) / 3  # coalesced: 40 deltas in 120 ms, about one frame per 20 ms


async def test_last_hands_back_the_waiting_chunk_for_the_replys_end_and_sends_nothing_more() -> None:
    clock, sent = ManualClock(), []
    chunks = batcher(clock, sent)
    await chunks.add("One. ")
    await chunks.add("Two. ")
    await clock.advance(0.02)  # the window ends: "Two. " goes
    await chunks.add("Three.")
    last = await chunks.last()  # inside the next window: held back, not sent
    assert [f["text"] for _, f in sent] == ["One. ", "Two. "]
    assert last == {"type": "reply.chunk", "run_id": "r", "reply_to_seq": 7, "index": 2, "text": "Three."}
    await clock.advance(1.0)
    assert len(sent) == 2  # the cancelled window sent nothing
    assert await chunks.last() is None  # nothing waits any more
    await chunks.send_last(last)
    assert [f["index"] for _, f in sent] == [0, 1, 2]


async def test_the_end_takes_what_waits_at_once_and_nothing_comes_after() -> None:
    clock, sent = ManualClock(), []
    chunks = batcher(clock, sent)
    await chunks.add("One. ")
    await chunks.add("Two. ")
    await chunks.add("Three.")
    await chunks.send_last(await chunks.last())  # the reply ended inside the window: no wait for it to end
    assert [f["text"] for _, f in sent] == ["One. ", "Two. Three."]
    await clock.advance(1.0)
    assert len(sent) == 2  # the cancelled window sent nothing more


# --- a socket's inbox: timeline.new coalesced, nothing dropped silently -----------------


def test_timeline_new_is_one_pending_hint_per_socket_replaced_not_queued() -> None:
    inbox = SocketInbox(10)
    inbox.put_nowait({"type": "timeline.new", "seq": 3})
    inbox.put_nowait({"type": "reply.chunk", "text": "a"})
    shared = {"type": "timeline.new", "seq": 5}
    inbox.put_nowait(shared)
    inbox.put_nowait({"type": "timeline.new", "seq": 4})  # an older hint never lowers it
    taken = [inbox.get_nowait() for _ in range(inbox.qsize())]
    assert taken == [{"type": "reply.chunk", "text": "a"}, {"type": "timeline.new", "seq": 5}]
    assert shared == {"type": "timeline.new", "seq": 5}  # the group's dict, shared by other sockets, untouched
    inbox.put_nowait({"type": "timeline.new", "seq": 6})  # taken: the next one is queued again
    assert inbox.get_nowait() == {"type": "timeline.new", "seq": 6}


def test_a_full_inbox_logs_what_it_drops_and_tells_the_device_to_sync(events: Any) -> None:
    inbox = SocketInbox(2)
    inbox.put_nowait({"type": "reply.done", "seq": 8, "text": "the reply"})
    inbox.put_nowait({"type": "activity", "task_id": "t"})
    inbox.put_nowait({"type": "reply.chunk", "text": "x"})
    dropped = events.events("frame_undelivered")
    assert [e["frame"] for e in dropped] == ["reply.done", "activity"]
    assert dropped[0]["seq"] == 8
    # The reply.done's seq became a hint to sync; the new frame is queued after it.
    assert [inbox.get_nowait() for _ in range(inbox.qsize())] == [
        {"type": "timeline.new", "seq": 8},
        {"type": "reply.chunk", "text": "x"},
    ]


# --- overflow end to end: the device recovers everything with sync ----------------------


def _redis_layer(prefix: str, *, process_capacity: int) -> dict[str, Any]:
    return {
        "default": {
            "BACKEND": "yimi_project.infra.channel_layers.RedisChannelLayer",
            "CONFIG": {
                "hosts": [{"address": django_settings.REDIS_URL, "socket_timeout": django_settings.CHANNEL_LAYER_SOCKET_TIMEOUT_SECONDS}],
                "prefix": prefix,
                "capacity": 100,
                "channel_capacity": {"specific.*": process_capacity},
            },
        }
    }


async def test_after_an_overflow_the_device_syncs_every_entry_with_no_gap(
    make_device: Any, owner: Any, settings: Any, events: Any
) -> None:
    need(bool(django_settings.REDIS_URL), "REDIS_URL is not set")
    with redis_prefix("overflow") as prefix:
        settings.CHANNEL_LAYERS = _redis_layer(prefix, process_capacity=3)  # this process's inbox holds 3 messages
        sim = await db_async(make_device)()
        comm, ready = await open_socket(sim)
        try:
            reminders = 12
            due = timezone.now() + timedelta(hours=1)
            for i in range(reminders):
                await db_async(create_reminder)(owner, f"reminder {i}", due.isoformat())

            def fire() -> None:  # its own thread and event loop, pushing through the same layer
                try:
                    fire_due_reminders(now=due + timedelta(seconds=1))
                finally:
                    connection.close()

            # While this loop is blocked the socket cannot drain this process's inbox: 12
            # notices and 12 timeline.new hints meet an inbox of 3 (plus, at most, the one a
            # pop already waiting on Redis takes), deterministically.
            pusher = threading.Thread(target=fire)
            pusher.start()
            pusher.join(60)
            assert not pusher.is_alive()
            undelivered = events.events("frame_undelivered")
            assert all(e["reason"] == "process_inbox_full" and e["group"] == f"owner.{owner.id}" for e in undelivered)
            assert 2 * reminders - 4 <= len(undelivered) <= 2 * reminders - 3  # each one logged, none silently

            # Hold the socket past the channel layer's blocking pop and redis-py's timeout.
            await asyncio.sleep(django_settings.CHANNEL_LAYER_SOCKET_TIMEOUT_SECONDS + 1)
            while not await comm.receive_nothing(timeout=1.0):
                await comm.receive_json_from()  # what fitted

            # The device does what docs/protocol.md says: sync after the last seq it has.
            await comm.send_json_to({"type": "sync", "id": "catch-up", "after": ready["last_seq"], "limit": 200})
            page = await receive_until(comm, "sync.page")
            seqs = [e["seq"] for e in page["entries"]]
            assert seqs == list(range(ready["last_seq"] + 1, ready["last_seq"] + 1 + reminders))  # every one, no gap
            assert [e["text"].endswith(f"reminder {i}") for i, e in enumerate(page["entries"])] == [True] * reminders
            assert not page["has_more"]
        finally:
            await comm.disconnect()


# --- the recovery sweep: never more run messages than runs -----------------------------


def _queue_length(prefix: str) -> int:
    """Run entries waiting for a worker: on the run lane (brain.run_lane), where runs go."""
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    try:
        return int(client.llen(f"{prefix}:{prefix}-tasks.runs"))
    finally:
        client.close()


def _pop_one(prefix: str) -> None:
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    try:
        client.rpop(f"{prefix}:{prefix}-tasks.runs")
    finally:
        client.close()


async def test_the_sweep_requeues_only_runs_that_lost_their_message(make_device: Any, settings: Any) -> None:
    need(bool(django_settings.REDIS_URL), "REDIS_URL is not set")
    sim = await db_async(make_device)()
    runs = [await db_async(accept_utterance)(sim.device, new_client_id(), f"text {i}") for i in range(4)]  # stored, never sent
    start = timezone.now()
    interval = timedelta(seconds=settings.RUN_RECOVERY_SECONDS)
    with redis_prefix("sweep") as prefix, publishing_to(prefix, settings):  # a real broker, no worker
        assert await recover_runs(now=start) == (0, 0)  # their first message is not older than the interval
        assert _queue_length(prefix) == 0
        sweep_at = start
        lengths = []
        for _ in range(4):  # four sweeps, one interval apart, well inside the 3 minutes
            sweep_at += interval + timedelta(seconds=1)
            await recover_runs(now=sweep_at)
            queued = await db_async(Run.objects.filter(state=Run.State.QUEUED).count)()
            lengths.append(_queue_length(prefix))
            assert lengths[-1] <= queued
        assert lengths == [4, 4, 4, 4]  # the first sweep sent each once; the others saw them waiting
        assert await db_async(runs_on_queue)() == {str(a.run_id) for a in runs}

        _pop_one(prefix)  # one message is lost (a broker restart, say)
        sweep_at += interval + timedelta(seconds=1)
        assert await recover_runs(now=sweep_at) == (1, 0)  # only that run is sent again
        assert _queue_length(prefix) == 4

        # A sweep right after (a second sweeper, or the worker's start-up recovery) sends nothing:
        # the run's message is younger than the interval.
        assert await recover_runs(now=sweep_at) == (0, 0)
        assert _queue_length(prefix) == 4
