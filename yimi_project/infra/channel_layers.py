"""The channel layers the device sockets receive on: Channels' own (``channels_redis`` with
Redis, the in-memory one in the embedded default), with two rules added (docs/protocol.md,
"Lost frames and sync"):

- **no silent loss**: a frame that does not fit where it is going — a process's inbox on
  Redis at its capacity, or one socket's inbox in its process — is logged
  (``frame_undelivered`` with the group or socket, the frame's type and, when it has one,
  its timeline ``seq``), never dropped without a trace. Everything a device must not miss
  is in the timeline, so a device recovers it with ``sync``;
- **``timeline.new`` is coalesced per socket**: a socket has at most one ``timeline.new``
  waiting in its inbox. A newer one replaces it (the highest ``seq`` wins) and moves to the
  end, so a socket that falls behind gets one "sync up to N", never a queue of them. A
  frame dropped from a full socket inbox that carried a ``seq`` (``reply.done``,
  ``notice``) becomes such a hint too, so that device syncs what it lost.

How capacity works with ``channels_redis`` (4.3): every socket of one web process receives
through one Redis key (``specific.<process>!``), so Redis's bound is per process
(``channel_capacity`` for ``specific.*``, sized ``WS_SOCKET_CAPACITY`` x
``WS_SOCKETS_PER_PROCESS`` in settings), while each socket's own inbox in the process is
bounded by ``capacity`` (``WS_SOCKET_CAPACITY``). A group has no capacity of its own: a
group message is one entry per process inbox, fanned out to the sockets in the process.

Yimi's Redis layer sends a group message in one round trip, naming the group instead of
its members, and each process hands it to its own sockets in the group (``group_send``);
one reader task per process inbox hands every message to its socket's inbox (``receive``).
Every process of an instance runs this code: an upgrade restarts them together.

Patches: ``channels_redis``'s ``RedisChannelLayer`` (``receive``, ``group_send``, its Redis
pool) and Channels' ``InMemoryChannelLayer`` (``send``, ``group_send``), wired by
``CHANNEL_LAYERS["default"]["BACKEND"]`` in settings. Why: as shipped, a group send took
four round trips and each received message four more, every waiting socket raced for one
lock (~10% of a web process's CPU per text, issue 14), a full inbox dropped its oldest
message without a trace, and redis-py handed out pooled connections a Redis outage had
killed (issue 35; docs/decisions/2026-12-03-channel-layer.md). Drop it when
``channels_redis`` receives through one reader per process inbox, sends to a group in one
round trip, reports what does not fit instead of dropping it, and never hands out a dead
connection; the ``timeline.new`` coalescing would then move to the device consumer.
Tests: tests/yimi_project/test_channel_layer.py, tests/yimi_project/test_delivery.py, tests/e2e/test_outages.py.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from typing import Any

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer as ChannelsInMemoryLayer
from channels_redis.core import RedisChannelLayer as ChannelsRedisLayer
from channels_redis.utils import create_pool
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import RedisError, ResponseError
from redis.maint_notifications import MaintNotificationsConfig

from yimi_project import push
from yimi_project.logs import log_event

TIMELINE_NEW = "timeline.new"


def _frame_fields(message: dict[str, Any]) -> dict[str, Any]:
    seq = message.get("seq")
    return {"frame": message.get("type"), "seq": seq if isinstance(seq, int) else None}


def _newer_hint(pending: dict[str, Any] | None, seq: Any) -> dict[str, Any]:
    """A ``timeline.new`` for the highest of ``pending``'s seq and ``seq``."""
    seqs = [s for s in ((pending or {}).get("seq"), seq) if isinstance(s, int) and not isinstance(s, bool)]
    return {"type": TIMELINE_NEW, "seq": max(seqs) if seqs else None}


class SocketInbox(asyncio.Queue):  # type: ignore[type-arg]
    """One socket's messages inside its process (replaces ``channels_redis``'s
    ``BoundedQueue``, which drops the oldest message of a full queue silently).

    Steps of ``put_nowait``: 1. a ``timeline.new`` while one is waiting: the waiting one
    is removed and a merged one (highest ``seq``) appended — nothing more is queued; 2.
    while the inbox is full, its oldest message is dropped and logged
    (``frame_undelivered``), and one that carried a timeline ``seq`` (``reply.done``,
    ``notice``) is folded into the waiting ``timeline.new`` (made if there is none), so the
    device syncs it; 3. the message is queued.
    """

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize=maxsize)
        self.timeline: dict[str, Any] | None = None  # the timeline.new waiting in the inbox
        self.error: BaseException | None = None  # fail()

    def _replace_timeline(self, seq: Any) -> None:
        old = self.timeline
        if old is not None:
            self._queue.remove(old)  # type: ignore[attr-defined]
        self.timeline = _newer_hint(old, seq)
        self._queue.append(self.timeline)  # type: ignore[attr-defined]

    def put_nowait(self, item: dict[str, Any]) -> None:
        if item.get("type") == TIMELINE_NEW and self.timeline is not None:
            self._replace_timeline(item.get("seq"))
            return
        while self.full():
            dropped = self.get_nowait()
            log_event("frame_undelivered", level=logging.WARNING, reason="socket_inbox_full", **_frame_fields(dropped))
            seq = dropped.get("seq")
            if isinstance(seq, int) and dropped.get("type") != TIMELINE_NEW:
                # What it carried is in the timeline: the device is told to sync it.
                self._replace_timeline(seq)
        if item.get("type") == TIMELINE_NEW:
            item = dict(item)  # one dict is shared by every socket of a group message
            self.timeline = item
        super().put_nowait(item)

    def _get(self) -> dict[str, Any]:
        item = super()._get()  # type: ignore[misc]
        if item is self.timeline:
            self.timeline = None
        return item

    def fail(self, error: BaseException) -> None:
        """Wake the socket waiting on this (empty) inbox with ``error``: the process
        inbox's reader failed (Redis is down), and its receive raises it."""
        self.error = error
        asyncio.Queue.put_nowait(self, _FAILED)


_FAILED: dict[str, Any] = {"type": "yimi.reader_failed"}  # SocketInbox.fail's marker


def _raise_if_cancelled() -> None:
    """Python 3.11's ``asyncio.wait_for`` (redis-py's socket writes) can swallow a cancel
    that comes as its inner await finishes; the task still counts the request
    (``Task.cancelling``). A loop that would otherwise run on, the reader's, ends here."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError()
class _RefusesAResetConnection(AbstractConnection):
    """A pooled Redis connection the server reset (RST: a Redis that went away, a proxy or
    NAT dropping its connections) is not handed out again. redis-py's check as a connection
    leaves the pool (``ensure_connection``) reconnects one with buffered data or at end of
    file, but a reset sets an error on the stream, not its end of file; its transport is
    closed, though. A connection whose transport is closing or closed counts as having
    something to read, so the pool reconnects it first."""

    async def can_read(self) -> bool:
        writer = self._writer
        if writer is not None and writer.is_closing():
            return True
        return await super().can_read()


@functools.cache
def _refusing_a_reset(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    """``connection_class`` (TCP, TLS or Unix socket, as the URL said) with that check."""
    return type(f"Checked{connection_class.__name__}", (_RefusesAResetConnection, connection_class), {})


CLOSED_CHANNELS_REMEMBERED = 4096
# Messages the reader takes off its process inbox in one round trip (BZMPOP's COUNT): under
# load one trip brings what has queued meanwhile instead of one trip per message (issue 14).
POP_BATCH = 64


class RedisChannelLayer(ChannelsRedisLayer):
    """``channels_redis``'s layer with socket inboxes (``SocketInbox``) and a logged
    ``group_send`` over capacity."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.receive_buffer: collections.defaultdict[str, SocketInbox] = collections.defaultdict(
            functools.partial(SocketInbox, self.capacity)
        )
        self._readers: dict[str, asyncio.Task[None]] = {}  # per process inbox (receive)
        self._open: set[str] = set()  # this process's sockets' channels, receiving
        self._closed: collections.OrderedDict[str, None] = collections.OrderedDict()  # recently, latest last
        self._local_groups: dict[str, set[str]] = {}  # group -> this process's sockets in it
        self._channel_groups: dict[str, set[str]] = {}  # and back
        self._taken: dict[str, collections.deque[bytes]] = {}  # process inbox key -> taken, not yet handed on
        self._batch_pop = True  # BZMPOP (Redis 7); False after a server without it said so

    def create_pool(self, index: int) -> Any:
        """``channels_redis``'s pool for host ``index``, which never hands out a connection
        the server closed or reset (issue 35).

        redis-py 8 checks a pooled connection as it leaves the pool only while "maintenance
        notifications" (a Redis Enterprise/Cloud feature) are off, and they are on ("auto")
        by default: after a Redis outage every pooled connection was handed out dead, and
        the command on it failed ("Connection closed by server") — a socket's ``group_add``
        refused with 1013, the process inbox's reader failing every socket waiting on it —
        until each one had been used once; a burst reached connections that had lain
        unused since the outage, minutes later. Steps: 1. maintenance notifications off (a
        self-hosted Redis sends none), so the check runs; 2. the connections also count a
        reset transport as closed (``_RefusesAResetConnection``)."""
        pool = create_pool({"maint_notifications_config": MaintNotificationsConfig(enabled=False), **self.hosts[index]})
        if not issubclass(pool.connection_class, _RefusesAResetConnection):
            pool.connection_class = _refusing_a_reset(pool.connection_class)
        return pool

    async def receive(self, channel: str) -> dict[str, Any]:
        """The next message for one socket of this process (``specific.<process>!<socket>``).

        ``channels_redis`` has every waiting socket race for one lock with two new tasks per
        message, the lock's winner reading the process inbox for all of them (~10% of the
        web process's CPU per text, issue 14). Here one reader task per process inbox
        (``_read``) takes its messages in order (``receive_single``) and puts each into the
        inbox of the socket it is for (``SocketInbox``: coalesced ``timeline.new``, logged
        overflow); a socket's receive only waits on its own inbox.

        Steps: 1. the channel counts as open from its first receive until a receive of it is
        cancelled (the socket's consumer ended); 2. the reader starts with the first receive
        on the event loop and serves until ``flush``/``close_pools`` or its loop ends (idle,
        it waits in one blocking pop per ``brpop_timeout``); 3. a message for a channel that
        ended is logged (``frame_undelivered``, ``socket_gone``) and dropped; 4. if the
        reader fails (Redis down), every socket waiting on an empty inbox gets the error, as
        it got it from its own read before, and the next receive starts a new reader. Other
        channels receive as ``channels_redis``."""
        if "!" not in channel:
            return await super().receive(channel)  # type: ignore[no-any-return]
        assert self.require_valid_channel_name(channel)
        real_channel = self.non_local_name(channel)
        assert real_channel.endswith(self.client_prefix + "!"), "Wrong client prefix"
        self._open.add(channel)
        self._closed.pop(channel, None)
        inbox = self.receive_buffer[channel]
        if inbox.empty():
            self._start_reader(real_channel)
        try:
            message = await inbox.get()
        except asyncio.CancelledError:
            self._close(channel)
            raise
        if message is _FAILED:
            self._close(channel)
            assert inbox.error is not None
            raise inbox.error
        return message

    def _start_reader(self, real_channel: str) -> None:
        loop = asyncio.get_running_loop()
        reader = self._readers.get(real_channel)
        if reader is not None and not reader.done():
            if reader.get_loop() is loop:
                return
            if not reader.get_loop().is_closed():
                raise RuntimeError("Two event loops are trying to receive() on one channel layer at once!")
        self._readers[real_channel] = loop.create_task(self._read(real_channel))

    def forget_channel(self, channel: str) -> None:
        """The socket receiving on ``channel`` ended (its consumer calls this as it exits):
        its inbox and its memberships here go. A cancelled receive does the same, but a
        consumer can end with its last receive already done (a handler that raised)."""
        if "!" in channel:
            self._close(channel)

    def _close(self, channel: str) -> None:
        self._open.discard(channel)
        self.receive_buffer.pop(channel, None)
        for group in list(self._channel_groups.get(channel, ())):
            self._forget_local_member(group, channel)
        self._closed[channel] = None
        if len(self._closed) > CLOSED_CHANNELS_REMEMBERED:
            self._closed.popitem(last=False)

    async def _read(self, real_channel: str) -> None:
        try:
            while True:
                try:
                    message_channel, message = await self.receive_single(real_channel)
                except (RedisError, OSError):
                    raise
                except Exception as exc:  # noqa: BLE001 - one unreadable message, not the inbox
                    _raise_if_cancelled()
                    log_event("channel_message_unreadable", level=logging.WARNING, error=type(exc).__name__)
                    continue
                _raise_if_cancelled()
                if message_channel == []:  # a group message, and none of our sockets is in it now
                    log_event("frame_undelivered", level=logging.INFO, reason="socket_gone", **_frame_fields(message))
                channels = message_channel if isinstance(message_channel, list) else [message_channel]
                if message.get("type") == TIMELINE_NEW and isinstance(message_channel, list):
                    channels = self._not_knowing(channels, message)
                for channel in channels:
                    if channel in self._closed:
                        log_event("frame_undelivered", level=logging.INFO, reason="socket_gone", **_frame_fields(message))
                    else:
                        self.receive_buffer[channel].put_nowait(message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to every socket waiting
            _raise_if_cancelled()  # redis-py may turn a cancel into its own error: it was a cancel
            for channel in list(self._open):
                inbox = self.receive_buffer.get(channel)
                if channel.startswith(real_channel) and inbox is not None and inbox.empty():
                    inbox.fail(exc)

    def _not_knowing(self, channels: list[str], message: dict[str, Any]) -> list[str]:
        """A group's ``timeline.new`` is not handed to this process's sockets it names as
        told its ``seq`` already (``push.timeline_new``: the socket whose ack carried it, the
        device whose ``reply.done`` did): their consumers would drop it (issue 14: two
        dispatches per text fewer). Any other socket of the group gets it, to be merged
        with a waiting hint there as before."""
        known: set[str] = set()
        if isinstance(socket := message.get("known_to_socket"), str):
            known.add(socket)
        if isinstance(device := message.get("known_to_device"), str):
            known |= self._local_groups.get(push.device_group(device), set())
        return [channel for channel in channels if channel not in known] if known else channels

    async def flush(self) -> None:
        self._stop_readers()
        await super().flush()

    async def close_pools(self) -> None:
        self._stop_readers()
        await super().close_pools()

    def _stop_readers(self) -> None:
        for reader in self._readers.values():
            if not reader.get_loop().is_closed():
                reader.cancel()
        self._readers.clear()
        self._open.clear()
        self.receive_buffer.clear()
        self._taken.clear()
        self._local_groups.clear()
        self._channel_groups.clear()

    async def receive_single(self, channel: str) -> tuple[Any, dict[str, Any]]:
        """One message off this process's inbox (``specific.<process>!``). The messages are
        taken in batches: one BZMPOP takes up to ``POP_BATCH`` of them in order (one when
        only one waits; it blocks while none does, again after each ``brpop_timeout``), and
        the next calls hand them on from here before Redis is asked again. A Redis without
        BZMPOP (before 7.0) gets one BZPOPMIN per message.

        Only the process's reader (``_read``) takes from its inbox, and it hands each message
        to its socket's inbox without awaiting anything in between, so there is no moment
        in which a cancelled receive could drop a message it took: ``channels_redis``'s
        backup of a taken message (``$inflight``, a restore script before every pop and a
        ZADD after it: three round trips per message) guarded against that and is not
        kept. What a process still holds (taken here, or in its sockets' inboxes) when it
        stops is lost, as with ``channels_redis``; each device recovers it with ``sync``.
        Other channels (not a process's) receive as ``channels_redis``."""
        if "!" not in channel:
            return await super().receive_single(channel)  # type: ignore[no-any-return]
        assert self.require_valid_channel_name(channel, receive=True), "Channel name invalid"
        assert channel.endswith("!")
        channel_key = self.prefix + channel
        taken = self._taken.setdefault(channel_key, collections.deque())
        while not taken:
            _raise_if_cancelled()
            taken.extend(await self._take(self.connection(self.consistent_hash(channel)), channel_key))
        message = self.deserialize(taken.popleft())
        if "__asgi_group__" in message:  # group_send: this process's sockets in the group now
            return sorted(self._local_groups.get(message.pop("__asgi_group__"), ())), message
        if "__asgi_channel__" in message:
            return message.pop("__asgi_channel__"), message
        return channel, message

    async def _take(self, connection: Any, channel_key: str) -> list[bytes]:
        """The next messages of one process inbox, oldest first: none after ``brpop_timeout``
        with nothing waiting."""
        if self._batch_pop:
            try:
                popped = await connection.bzmpop(self.brpop_timeout, 1, [channel_key], min=True, count=POP_BATCH)
            except ResponseError as exc:
                if not any(refusal in str(exc).lower() for refusal in ("unknown command", "noperm")):
                    raise  # a Redis before 7.0 does not know BZMPOP; an ACL may not allow it
                self._batch_pop = False
                log_event("channel_batch_pop_unavailable", level=logging.WARNING, detail=str(exc)[:200])
                return []
            return [member for member, _score in popped[1]] if popped is not None else []
        popped = await connection.bzpopmin(channel_key, timeout=self.brpop_timeout)
        return [popped[1]] if popped is not None else []

    async def group_add(self, group: str, channel: str) -> None:
        if "!" in channel:  # one of this process's sockets: its group messages come by group name
            # Known here before Redis knows it: a message sent as soon as Redis does finds it.
            self._local_groups.setdefault(group, set()).add(channel)
            self._channel_groups.setdefault(channel, set()).add(group)
        try:
            await super().group_add(group, channel)
        except BaseException:
            self._forget_local_member(group, channel)
            raise

    async def group_discard(self, group: str, channel: str) -> None:
        await super().group_discard(group, channel)
        self._forget_local_member(group, channel)

    def _forget_local_member(self, group: str, channel: str) -> None:
        members = self._local_groups.get(group)
        if members is not None:
            members.discard(channel)
            if not members:
                del self._local_groups[group]
        groups = self._channel_groups.get(channel)
        if groups is not None:
            groups.discard(group)
            if not groups:
                del self._channel_groups[channel]

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        """A group message in one round trip, where ``channels_redis`` (4.3.0) takes four,
        with a process inbox at its capacity reported with ``frame_undelivered`` (group,
        frame type, seq, how many inboxes) instead of an INFO line without the frame.

        Steps (one Redis host, the usual case): 1. one script (``GROUP_SEND_LUA_ONE_HOST``):
        forget the group's members past the group expiry; for each process inbox the others
        receive in, forget messages past the message expiry, then add the message where the
        inbox is below its capacity and count the others; return members that are not a
        process's socket (none, in Yimi); 2. the message carries the group's name
        (``__asgi_group__``), not its members: the receiving process hands it to its own
        sockets in the group (``group_add`` here keeps that list), one serialization for
        all; 3. a member that is not a process's socket gets ``send`` as before. With
        several hosts, ``_group_send_per_host``: two round trips per host."""
        await self.group_send_many([(group, message)])

    async def group_send_many(self, sends: list[tuple[str, dict[str, Any]]]) -> None:
        """``group_send`` of each (group, message) of ``sends``, in that order, in one round
        trip on one Redis host (one script run for all of them; a process inbox that gets
        several takes them in this order)."""
        for group, _ in sends:
            assert self.require_valid_group_name(group), "Group name not valid"
        if self.ring_size > 1:
            for group, message in sends:
                await self._group_send_per_host(group, message)
            return
        now = time.time()
        args: list[Any] = [
            self.prefix, int(now) - self.group_expiry, int(now) - int(self.expiry), self.expiry,
            self.get_capacity("specific.inbox!"),
        ]
        for i, (group, message) in enumerate(sends):  # scores a microsecond apart: popped in order
            args += [self.serialize({**message, "__asgi_group__": group}), now + i * 1e-6]
        keys = [self._group_key(group) for group, _ in sends]
        results = await self.connection(0).eval(GROUP_SEND_LUA_ONE_HOST, len(keys), *keys, *args)
        for (group, message), (over, others) in zip(sends, results, strict=True):
            for channel in others:
                try:
                    await self.send(channel.decode("utf8"), message)
                except ChannelFull:
                    over += 1
            if over:
                log_event("frame_undelivered", level=logging.WARNING, reason="process_inbox_full",
                          group=group, inboxes=int(over), **_frame_fields(message))

    async def _group_send_per_host(self, group: str, message: dict[str, Any]) -> None:
        """``channels_redis``'s ``group_send`` in two round trips per host, where it took four.

        Steps: 1. one pipeline: forget members past the group expiry, read the others;
        2. per host, one script (``GROUP_SEND_LUA``): in each inbox, forget messages past
        the message expiry, then add the message where the inbox is below its capacity and
        count the others. The same commands as ``channels_redis``'s, in fewer trips."""
        key = self._group_key(group)
        pipe = self.connection(self.consistent_hash(group)).pipeline(transaction=False)
        pipe.zremrangebyscore(key, min=0, max=int(time.time()) - self.group_expiry)
        pipe.zrange(key, 0, -1)
        _, members = await pipe.execute()
        channel_names = [x.decode("utf8") for x in members]
        by_connection, messages, capacities = self._map_channel_keys_to_connection(channel_names, message)
        for index, channel_keys in by_connection.items():
            now = time.time()
            args = [messages[k] for k in channel_keys] + [capacities[k] for k in channel_keys]
            args += [int(now) - int(self.expiry), now, self.expiry]
            over = await self.connection(index).eval(GROUP_SEND_LUA, len(channel_keys), *channel_keys, *args)
            if over:
                log_event("frame_undelivered", level=logging.WARNING, reason="process_inbox_full",
                          group=group, inboxes=int(over), **_frame_fields(message))


# group_send on one host, for one group or several in order: KEYS the groups; ARGV the key
# prefix, the members' and the messages' expiry cutoffs, the inboxes' expiry and capacity, then
# per group its message (serialized once, naming the group) and score (the time). A member
# "specific.<process>!<socket>" receives in the process's inbox "<prefix>specific.<process>!",
# which gets the message once for all of the process's members. Returns, per group, the
# inboxes over capacity and the members that are no socket.
GROUP_SEND_LUA_ONE_HOST = """
    local prefix, capacity = ARGV[1], tonumber(ARGV[5])
    local results = {}
    for g = 1, #KEYS do
        local message, score = ARGV[4 + 2 * g], ARGV[5 + 2 * g]
        redis.call('ZREMRANGEBYSCORE', KEYS[g], 0, ARGV[2])
        local over_capacity, done, others = 0, {}, {}
        for _, member in ipairs(redis.call('ZRANGE', KEYS[g], 0, -1)) do
            local bang = string.find(member, '!', 1, true)
            if not bang then
                table.insert(others, member)
            else
                local inbox = prefix .. string.sub(member, 1, bang)
                if not done[inbox] then
                    done[inbox] = true
                    redis.call('ZREMRANGEBYSCORE', inbox, 0, ARGV[3])
                    if redis.call('ZCOUNT', inbox, '-inf', '+inf') < capacity then
                        redis.call('ZADD', inbox, score, message)
                        redis.call('EXPIRE', inbox, ARGV[4])
                    else
                        over_capacity = over_capacity + 1
                    end
                end
            end
        end
        results[g] = {over_capacity, others}
    end
    return results
"""


# channels_redis 4.3.0's script, with the expired messages of each inbox removed first (it
# sends ZREMRANGEBYSCORE for each in a pipeline of its own before the script): add to each
# inbox below its capacity, count the others.
GROUP_SEND_LUA = """
    local over_capacity = 0
    local expired_before = ARGV[#ARGV - 2]
    local current_time = ARGV[#ARGV - 1]
    local expiry = ARGV[#ARGV]
    for i=1,#KEYS do
        redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, expired_before)
        if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[i + #KEYS]) then
            redis.call('ZADD', KEYS[i], current_time, ARGV[i])
            redis.call('EXPIRE', KEYS[i], expiry)
        else
            over_capacity = over_capacity + 1
        end
    end
    return over_capacity
"""


class InMemoryChannelLayer(ChannelsInMemoryLayer):
    """The embedded default's layer (one process: a channel is one socket's inbox) with the
    same two rules: ``timeline.new`` coalesced per socket, undelivered frames logged."""

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        if message.get("type") == TIMELINE_NEW:
            queue = self.channels.get(channel)
            waiting = next((item for item in queue._queue if item[1].get("type") == TIMELINE_NEW), None) if queue else None
            if queue is not None and waiting is not None:
                queue._queue.remove(waiting)
                queue._queue.append((time.time() + self.expiry, _newer_hint(waiting[1], message.get("seq"))))
                return
        await super().send(channel, message)

    async def group_send_many(self, sends: list[tuple[str, dict[str, Any]]]) -> None:
        for group, message in sends:
            await self.group_send(group, message)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        assert isinstance(message, dict), "Message is not a dict"
        self.require_valid_group_name(group)
        self._clean_expired()
        over = 0
        for channel in list(self.groups.get(group, {})):
            try:
                await self.send(channel, message)
            except ChannelFull:
                over += 1
        if over:
            log_event("frame_undelivered", level=logging.WARNING, reason="socket_inbox_full",
                      group=group, inboxes=over, **_frame_fields(message))
