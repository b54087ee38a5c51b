"""The Redis channel layer's ``group_send`` (yimi_project/infra/channel_layers.py) against a real
Redis: what channels_redis's does — expired members and messages forgotten, a process
inbox filled up to its capacity — in two round trips per host."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
import redis.asyncio
from django.conf import settings as django_settings

from tests.conftest import need
from tests.support.tcp_proxy import TcpProxy
from yimi_project.infra.channel_layers import RedisChannelLayer

EXPIRY = 60


@pytest.fixture
def layer() -> Any:
    need(bool(django_settings.REDIS_URL), "REDIS_URL is not set")
    prefix = f"yimi-test-layer-{uuid.uuid4().hex[:8]}"
    yield RedisChannelLayer(
        hosts=[{"address": django_settings.REDIS_URL, "socket_timeout": django_settings.CHANNEL_LAYER_SOCKET_TIMEOUT_SECONDS}],
        prefix=prefix, expiry=EXPIRY, capacity=5,
        channel_capacity={"specific.*": 3},
    )
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)


async def test_a_group_message_reaches_every_socket_of_the_process_once(layer: Any) -> None:
    a, b = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("owner.1", a)
    await layer.group_add("owner.1", b)
    await layer.group_send("owner.1", {"type": "timeline.new", "seq": 7})
    assert await layer.receive(a) == {"type": "timeline.new", "seq": 7}
    assert await layer.receive(b) == {"type": "timeline.new", "seq": 7}
    inbox = layer.prefix + layer.non_local_name(a)
    assert redis.Redis.from_url(django_settings.REDIS_URL).zcard(inbox) == 0  # one entry for both, taken
    await layer.flush()


async def test_expired_messages_make_room_and_expired_members_get_nothing(layer: Any) -> None:
    a = await layer.new_channel()
    await layer.group_add("owner.1", a)
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    inbox = layer.prefix + layer.non_local_name(a)
    old = time.time() - EXPIRY - 10
    client.zadd(inbox, {f"stale-{i}".encode(): old for i in range(3)})  # the process inbox's capacity, all expired
    gone = f"{layer.client_prefix}!gone"  # a member that left long ago, without group_discard
    client.zadd(layer._group_key("owner.1"), {gone: int(old) - layer.group_expiry})
    await layer.group_send("owner.1", {"type": "timeline.new", "seq": 8})
    assert [m for m in client.zrange(inbox, 0, -1) if m.startswith(b"stale-")] == []
    assert await layer.receive(a) == {"type": "timeline.new", "seq": 8}
    assert client.zscore(layer._group_key("owner.1"), gone) is None
    await layer.flush()


async def test_a_full_process_inbox_is_not_overfilled_and_the_loss_is_logged(layer: Any, caplog: Any) -> None:
    a = await layer.new_channel()
    await layer.group_add("owner.1", a)
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    inbox = layer.prefix + layer.non_local_name(a)
    for seq in range(5):
        await layer.group_send("owner.1", {"type": "notice", "seq": seq})
    assert client.zcard(inbox) == 3  # channel_capacity of specific.*
    assert sum("frame_undelivered" in r.getMessage() for r in caplog.records) == 2
    await layer.flush()


async def test_a_process_inbox_hands_over_every_message_once_in_order(layer: Any) -> None:
    a, b = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("owner.1", a)
    await layer.group_add("device.1", b)
    for seq in range(3):  # capacity 3: all wait in the inbox, taken in one round trip
        await layer.group_send("device.1" if seq == 1 else "owner.1", {"type": "notice", "seq": seq})
    takes = []
    real_take = layer._take

    async def take(*args: Any) -> Any:
        takes.append(taken := await real_take(*args))
        return taken

    layer._take = take
    assert [(await layer.receive(a))["seq"], (await layer.receive(b))["seq"], (await layer.receive(a))["seq"]] == [0, 1, 2]
    assert [len(t) for t in takes] == [3]  # one BZMPOP for the three
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    inbox = layer.prefix + layer.non_local_name(a)
    assert client.zcard(inbox) == 0
    waiting = asyncio.ensure_future(layer.receive(a))  # an empty inbox: the reader's blocking pop
    await asyncio.sleep(0)  # the receive task takes its first step: its socket is open
    await layer.group_send("owner.1", {"type": "notice", "seq": 3})
    assert (await asyncio.wait_for(waiting, 10))["seq"] == 3
    await layer.group_send("owner.1", {"type": "notice", "seq": 4})
    assert (await layer.receive(a))["seq"] == 4
    assert client.zcard(inbox) == 0 and not client.exists(inbox + "$inflight")  # no backup is kept
    await layer.flush()


async def test_a_burst_of_sockets_joining_at_once_fits_the_configured_pool() -> None:
    """Many devices connecting at once (a restart, a network coming back): each socket's
    joins borrow a Redis connection at the same moment. redis-py's pool refuses the 101st by
    default (MaxConnectionsError, which the socket turned into service_unavailable); the
    settings' host config allows ``CHANNEL_LAYER_MAX_CONNECTIONS``."""
    need(bool(django_settings.REDIS_URL), "REDIS_URL is not set")
    [host] = [h for h in django_settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]]
    assert host["max_connections"] == django_settings.CHANNEL_LAYER_MAX_CONNECTIONS >= 300
    prefix = f"yimi-test-burst-{uuid.uuid4().hex[:8]}"
    layer = RedisChannelLayer(hosts=[{**host, "address": django_settings.REDIS_URL}], prefix=prefix)
    try:
        channels = [await layer.new_channel() for _ in range(300)]
        await asyncio.gather(*(layer.group_add(f"device.{i}", channel) for i, channel in enumerate(channels)))
        await layer.group_send("device.299", {"type": "timeline.new", "seq": 1})
        assert await layer.receive(channels[299]) == {"type": "timeline.new", "seq": 1}
    finally:
        await layer.flush()
        client = redis.Redis.from_url(django_settings.REDIS_URL)
        for key in client.scan_iter(f"{prefix}*"):
            client.delete(key)


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
async def test_after_redis_dropped_every_connection_the_pooled_ones_are_replaced(reset: bool) -> None:
    """A Redis outage through a proxy the test controls: every connection of the layer's
    pool ends (closed as by a Redis that stopped, or reset as by a proxy or a NAT), new
    ones are refused, then Redis is back. The pool had twenty idle connections; none of them
    is handed out dead: twenty sockets join at once and each gets the next message through
    the process inbox's reader, all on new connections. redis-py 8 handed every one of them
    out again (its check skipped while "maintenance notifications" are on, by default; a
    reset missed even then), each failing once: 1013 for the socket, or for every socket
    waiting when the dead one was the reader's."""
    need(bool(django_settings.REDIS_URL), "REDIS_URL is not set")
    prefix = f"yimi-test-outage-{uuid.uuid4().hex[:8]}"
    with TcpProxy.before(django_settings.REDIS_URL) as proxy:
        layer = RedisChannelLayer(
            hosts=[{"address": proxy.url(django_settings.REDIS_URL), "socket_timeout": django_settings.CHANNEL_LAYER_SOCKET_TIMEOUT_SECONDS}],
            prefix=prefix,
        )
        try:
            channels = [await layer.new_channel() for _ in range(20)]
            await asyncio.gather(*(layer.group_add("owner.1", channel) for channel in channels))  # 20 connections at once
            pool = layer.connection(0).connection_pool
            idle = list(pool._available_connections)
            assert len(idle) >= 10
            proxy.drop(reset=reset)
            deadline = time.monotonic() + 60  # a poll's bound on a busy machine, never a timed assertion
            # until this loop has seen every connection end (the proxy has closed them all)
            while not all(c._writer is None or c._writer.is_closing() or c._reader.at_eof() for c in idle):
                assert time.monotonic() < deadline, "the proxy's drop never reached the pooled connections"
                await asyncio.sleep(0.01)
            with pytest.raises(redis.exceptions.ConnectionError):
                await layer.group_add("owner.1", channels[0])  # down: refused
            proxy.accept()
            before = proxy.accepted
            await asyncio.gather(*(layer.group_add("owner.1", channel) for channel in channels))
            await layer.group_send("owner.1", {"type": "timeline.new", "seq": 9})
            received = await asyncio.gather(*(asyncio.wait_for(layer.receive(channel), 10) for channel in channels))
            assert received == [{"type": "timeline.new", "seq": 9}] * len(channels)
            assert proxy.accepted > before  # on connections made since Redis came back
        finally:
            await layer.flush()
            client = redis.Redis.from_url(django_settings.REDIS_URL)
            for key in client.scan_iter(f"{prefix}*"):
                client.delete(key)


async def test_one_reader_per_process_inbox_serves_every_socket(layer: Any, caplog: Any) -> None:
    """Sockets wait on their own inboxes; one reader takes the process inbox in order and
    hands each message to its socket. A socket whose receive is cancelled (its consumer
    ended) is closed: a message for it later is logged, not kept; the reader serves on for
    the others, and for sockets that come later, until the layer is flushed."""
    a, b = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("device.a", a)
    await layer.group_add("device.b", b)
    waiting_a, waiting_b = asyncio.ensure_future(layer.receive(a)), asyncio.ensure_future(layer.receive(b))
    await asyncio.sleep(0)  # the receive task takes its first step: its socket is open
    [reader] = layer._readers.values()
    await layer.group_send("device.b", {"type": "notice", "seq": 1})
    await layer.group_send("device.a", {"type": "notice", "seq": 2})
    assert (await asyncio.wait_for(waiting_b, 10))["seq"] == 1
    assert (await asyncio.wait_for(waiting_a, 10))["seq"] == 2
    waiting_b = asyncio.ensure_future(layer.receive(b))
    await asyncio.sleep(0)  # the receive task takes its first step: its socket is open
    waiting_b.cancel()  # b's consumer ended
    await asyncio.gather(waiting_b, return_exceptions=True)
    await layer.group_send("device.b", {"type": "notice", "seq": 3})
    await layer.group_send("device.a", {"type": "notice", "seq": 4})
    assert (await asyncio.wait_for(layer.receive(a), 10))["seq"] == 4
    assert b not in layer.receive_buffer
    gone = [r.yimi_fields for r in caplog.records if getattr(r, "yimi_fields", {}).get("reason") == "socket_gone"]
    assert gone == [{"reason": "socket_gone", "frame": "notice", "seq": 3}]
    c = await layer.new_channel()  # a socket that comes later: the same reader
    await layer.group_add("device.c", c)
    await layer.group_send("device.c", {"type": "notice", "seq": 5})
    assert (await asyncio.wait_for(layer.receive(c), 10))["seq"] == 5
    assert list(layer._readers.values()) == [reader] and not reader.done()
    await layer.flush()
    await asyncio.wait_for(asyncio.gather(reader, return_exceptions=True), 10)
    assert reader.cancelled() and not layer._readers


async def test_a_failing_reader_hands_its_error_to_every_waiting_socket(layer: Any, monkeypatch: Any) -> None:
    """Redis down under the reader: each socket waiting gets the error from its receive (the
    consumer then closes with service_unavailable, 1013, and is gone); the next receive, a
    new socket's, starts a new reader."""
    a, b = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("owner.1", a)
    await layer.group_add("owner.1", b)
    real = layer.receive_single
    failing = asyncio.Event()

    async def receive_single(channel: str) -> Any:
        if failing.is_set():
            raise redis.exceptions.ConnectionError("Redis went away")
        return await real(channel)

    monkeypatch.setattr(layer, "receive_single", receive_single)
    failing.set()
    outcomes = await asyncio.gather(
        asyncio.wait_for(layer.receive(a), 10), asyncio.wait_for(layer.receive(b), 10), return_exceptions=True
    )
    assert [type(o) for o in outcomes] == [redis.exceptions.ConnectionError] * 2
    failing.clear()
    c = await layer.new_channel()  # the device connects again: a new socket
    await layer.group_add("owner.1", c)
    await layer.group_send("owner.1", {"type": "timeline.new", "seq": 5})
    assert await asyncio.wait_for(layer.receive(c), 10) == {"type": "timeline.new", "seq": 5}
    await layer.flush()


async def test_a_group_message_reaches_each_process_once_and_only_the_sockets_in_the_group(layer: Any) -> None:
    """One script puts the message, naming its group, once into each process's inbox; each
    process hands it to its own sockets in the group (not to one that left it). A member
    that is not a process's socket gets it by ``send``."""
    other = RedisChannelLayer(hosts=layer.hosts, prefix=layer.prefix, expiry=EXPIRY, capacity=5,
                              channel_capacity={"specific.*": 3})  # a second web process
    a1, a2, b1 = await layer.new_channel(), await layer.new_channel(), await other.new_channel()
    left = await layer.new_channel()
    for channel in (a1, a2, left):
        await layer.group_add("owner.1", channel)
    await other.group_add("owner.1", b1)
    await layer.group_add("owner.1", "plain.listener")
    await layer.group_discard("owner.1", left)
    waiting_left = asyncio.ensure_future(layer.receive(left))
    await layer.group_send("owner.1", {"type": "timeline.new", "seq": 9})
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    assert client.zcard(layer.prefix + layer.non_local_name(a1)) <= 1  # once for a1 and a2 (unless taken already)
    for receiver, channel in ((layer, a1), (layer, a2), (other, b1), (layer, "plain.listener")):
        assert await asyncio.wait_for(receiver.receive(channel), 10) == {"type": "timeline.new", "seq": 9}
    await asyncio.sleep(0)  # the reader handed the message to its sockets in one step, as a1's shows
    assert not waiting_left.done()  # it left the group before the message
    waiting_left.cancel()
    await asyncio.gather(waiting_left, return_exceptions=True)
    await other.flush()
    await layer.flush()


async def test_a_group_message_sent_as_a_socket_joins_reaches_it(layer: Any) -> None:
    """The process knows a socket is in a group before Redis does: a message another
    process sends as soon as Redis lists the member (here while the join's EXPIRE is still
    on its way) is handed to the socket, not dropped as for a socket that left."""
    other = RedisChannelLayer(hosts=layer.hosts, prefix=layer.prefix, expiry=EXPIRY, capacity=5,
                              channel_capacity={"specific.*": 3})  # the worker
    channel = await layer.new_channel()
    waiting = asyncio.ensure_future(layer.receive(channel))
    await asyncio.sleep(0)  # the receive task takes its first step: its socket is open
    connection = layer.connection(0)
    expire = connection.expire
    in_redis = asyncio.Event()

    proceed = asyncio.Event()

    async def held_expire(*args: Any, **kwargs: Any) -> Any:
        in_redis.set()  # the ZADD is done: other processes see the member
        await proceed.wait()  # the join's last round trip, held until the message is sent
        return await expire(*args, **kwargs)

    connection.expire = held_expire  # type: ignore[method-assign]
    try:
        join = asyncio.ensure_future(layer.group_add("owner.1", channel))
        await asyncio.wait_for(in_redis.wait(), 10)
        await other.group_send("owner.1", {"type": "notice", "seq": 1})
        proceed.set()
        await join
    finally:
        connection.expire = expire  # type: ignore[method-assign]
    assert await asyncio.wait_for(waiting, 10) == {"type": "notice", "seq": 1}
    await other.flush()
    await layer.flush()


async def test_a_socket_that_ended_is_forgotten_and_an_unreadable_message_is_skipped(layer: Any, caplog: Any) -> None:
    """``forget_channel`` (the consumer's exit) drops the socket's inbox and memberships
    even when its last receive had completed; a message the reader cannot read is logged
    and skipped, and the reader serves on."""
    gone, live = await layer.new_channel(), await layer.new_channel()
    for channel in (gone, live):
        await layer.group_add("owner.1", channel)
    await layer.group_send("owner.1", {"type": "notice", "seq": 1})
    assert (await asyncio.wait_for(layer.receive(gone), 10))["seq"] == 1
    assert (await asyncio.wait_for(layer.receive(live), 10))["seq"] == 1
    layer.forget_channel(gone)  # its consumer ended without a receive pending
    inbox = layer.prefix + layer.non_local_name(live)
    redis.Redis.from_url(django_settings.REDIS_URL).zadd(inbox, {b"not a message": time.time()})
    await layer.group_send("owner.1", {"type": "notice", "seq": 2})
    assert (await asyncio.wait_for(layer.receive(live), 10))["seq"] == 2
    assert gone not in layer.receive_buffer and gone not in layer._open
    assert layer._local_groups == {"owner.1": {live}}
    assert any(r.getMessage() == "channel_message_unreadable" for r in caplog.records)
    await layer.flush()


async def test_with_several_redis_hosts_a_group_message_still_reaches_each_socket_once() -> None:
    """Sharded over two Redis hosts (here two databases of one server), ``group_send`` takes
    channels_redis's way, two round trips per host, and the reader hands the messages over
    by their channel lists."""
    need(bool(django_settings.REDIS_URL), "REDIS_URL is not set")
    prefix = f"yimi-test-hosts-{uuid.uuid4().hex[:8]}"
    url = urlsplit(django_settings.REDIS_URL)
    base = f"{url.scheme}://{url.netloc}"
    hosts = [{"address": f"{base}/{db}", "socket_timeout": django_settings.CHANNEL_LAYER_SOCKET_TIMEOUT_SECONDS} for db in (0, 1)]
    layer = RedisChannelLayer(hosts=hosts, prefix=prefix, expiry=EXPIRY, capacity=5)
    try:
        channels = [await layer.new_channel() for _ in range(4)]
        for channel in channels:
            await layer.group_add("owner.1", channel)
        await layer.group_send("owner.1", {"type": "timeline.new", "seq": 3})
        for channel in channels:
            assert await asyncio.wait_for(layer.receive(channel), 10) == {"type": "timeline.new", "seq": 3}
        await asyncio.sleep(0)
        assert all(layer.receive_buffer[channel].empty() for channel in channels)  # once each
    finally:
        await layer.flush()
        for db in (0, 1):
            client = redis.Redis.from_url(f"{base}/{db}")
            for key in client.scan_iter(f"{prefix}*"):
                client.delete(key)


async def test_a_redis_without_bzmpop_is_read_one_message_per_pop(layer: Any, monkeypatch: Any, caplog: Any) -> None:
    """Redis before 7.0 has no BZMPOP: the reader says so once and takes one message per
    BZPOPMIN, in order, losing nothing."""
    async def bzmpop(*args: Any, **kwargs: Any) -> Any:
        raise redis.exceptions.ResponseError("unknown command 'BZMPOP', with args beginning with: ")

    monkeypatch.setattr(redis.asyncio.Redis, "bzmpop", bzmpop)
    a = await layer.new_channel()
    await layer.group_add("owner.1", a)
    for seq in range(3):
        await layer.group_send("owner.1", {"type": "notice", "seq": seq})
    assert [(await asyncio.wait_for(layer.receive(a), 10))["seq"] for _ in range(3)] == [0, 1, 2]
    assert layer._batch_pop is False
    assert [r.getMessage() for r in caplog.records].count("channel_batch_pop_unavailable") == 1
    await layer.flush()


async def test_several_group_messages_go_in_one_round_trip_and_arrive_in_order(layer: Any, monkeypatch: Any) -> None:
    """A reply's end (to its device) and its hint (to the owner): one script run; the
    process inbox takes them in the order sent; each reaches only its group's sockets."""
    phone, mac = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("device.phone", phone)
    for channel in (phone, mac):
        await layer.group_add("owner.1", channel)
    evals = []
    real_eval = redis.asyncio.Redis.eval

    async def counted_eval(self: Any, *args: Any) -> Any:
        evals.append(args[1])
        return await real_eval(self, *args)

    monkeypatch.setattr(redis.asyncio.Redis, "eval", counted_eval)
    for round_ in range(20):  # same-time scores would come out in any order: the order holds every time
        await layer.group_send_many([
            ("device.phone", {"type": "reply.done", "seq": 2 * round_}),
            ("owner.1", {"type": "timeline.new", "seq": 2 * round_ + 1}),
        ])
        assert [await asyncio.wait_for(layer.receive(phone), 10) for _ in range(2)] == [
            {"type": "reply.done", "seq": 2 * round_}, {"type": "timeline.new", "seq": 2 * round_ + 1},
        ]
        assert await asyncio.wait_for(layer.receive(mac), 10) == {"type": "timeline.new", "seq": 2 * round_ + 1}
    assert evals == [2] * 20  # one script run with both groups, per pair
    await layer.flush()


async def test_a_timeline_new_skips_the_sockets_that_were_told_its_seq(layer: Any) -> None:
    phone, watch, watch2, mac = [await layer.new_channel() for _ in range(4)]
    for channel in (phone, watch, watch2, mac):
        await layer.group_add("owner.1", channel)
    await layer.group_add("device.w", watch)
    await layer.group_add("device.w", watch2)
    # The phone's ack carried seq 5; the watch's reply.done (both its sockets) carried seq 6.
    # (The process inbox holds 3 messages here: sent two at a time, read in between.)
    await layer.group_send("owner.1", {"type": "timeline.new", "seq": 5, "known_to_socket": phone})
    await layer.group_send("owner.1", {"type": "timeline.new", "seq": 6, "known_to_device": "w"})
    assert await layer.receive(phone) == {"type": "timeline.new", "seq": 6, "known_to_device": "w"}
    for channel in (watch, watch2):
        assert await layer.receive(channel) == {"type": "timeline.new", "seq": 5, "known_to_socket": phone}
    assert await layer.receive(mac) == {"type": "timeline.new", "seq": 6}  # the two hints, merged
    await layer.group_send("device.w", {"type": "reply.done", "seq": 7})
    await layer.group_send("owner.1", {"type": "timeline.new", "seq": 8})  # known to no one: to all
    for channel in (watch, watch2):
        assert await layer.receive(channel) == {"type": "reply.done", "seq": 7}
    for channel in (phone, watch, watch2, mac):
        assert await layer.receive(channel) == {"type": "timeline.new", "seq": 8}
        assert layer.receive_buffer[channel].empty()
    await layer.flush()
