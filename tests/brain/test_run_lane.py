"""The run lane (brain.run_lane): a queued run reaches a free worker slot as one Redis list
entry, not a Celery message. On real Redis; the executor is injected, so these tests see
what the lane hands over and when, without a brain. The lane on a real worker process is
exercised by every test that starts one (test_e2e, test_run_overlap, test_celery)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from django.conf import settings as django_settings

from brain import run_lane
from tests.conftest import need
from tests.support.process_support import publishing_to, redis_prefix

WAIT = 30.0  # longest wait for the lane to do something; never a timing assertion


@pytest.fixture
def lane_prefix(settings: Any) -> Any:
    need(bool(django_settings.REDIS_URL), "REDIS_URL is not set")
    with redis_prefix("lane") as prefix, publishing_to(prefix, settings):
        yield prefix


def _sync_client() -> redis.Redis:
    return redis.Redis.from_url(django_settings.REDIS_URL)


def _length() -> int:
    client = _sync_client()
    try:
        return int(client.llen(run_lane.lane_key()))
    finally:
        client.close()


class Recorder:
    """An executor that records each run it is given and holds it until released."""

    def __init__(self) -> None:
        self.started: list[tuple[str, dict[str, float]]] = []
        self.release: dict[str, asyncio.Event] = {}
        self.changed = asyncio.Event()
        self.running = 0
        self.most_at_once = 0

    async def __call__(self, run_id: str, stages: dict[str, float]) -> None:
        self.started.append((run_id, stages))
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        self.changed.set()
        try:
            await self.release.setdefault(run_id, asyncio.Event()).wait()
        finally:
            self.running -= 1
            self.changed.set()

    def let_go(self, run_id: str) -> None:
        self.release.setdefault(run_id, asyncio.Event()).set()

    async def until(self, condition: Any) -> None:
        async def wait() -> None:
            while not condition():
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(wait(), WAIT)


def _lane(recorder: Any, slots: int, block_seconds: int = 1) -> run_lane.Lane:
    """A lane whose blocking pop returns every second, so stopping it takes a second, not five."""
    return run_lane.Lane(recorder, slots=slots, url=run_lane.broker_url(), key=run_lane.lane_key(), block_seconds=block_seconds)


async def _stop(lane: run_lane.Lane, serving: asyncio.Task[None]) -> None:
    await lane.drain(WAIT)
    await asyncio.wait_for(serving, WAIT)


async def test_a_free_slot_takes_a_run_at_once_and_a_busy_worker_leaves_the_next_on_the_lane(lane_prefix: str) -> None:
    recorder = Recorder()
    lane = _lane(recorder, slots=1)
    serving = asyncio.ensure_future(lane.serve())
    try:
        await asyncio.to_thread(run_lane.push, "run-a", {"queued": 1.5})
        await asyncio.to_thread(run_lane.push, "run-b", {"queued": 2.5})
        await recorder.until(lambda: len(recorder.started) == 1)
        assert recorder.started == [("run-a", {"queued": 1.5})]  # first in, first out, its trace stages with it
        # The one slot is busy: run-b stays on the lane (for this worker's next free slot, or another worker).
        assert await asyncio.to_thread(_length) == 1
        assert await asyncio.to_thread(run_lane.run_ids, await asyncio.to_thread(_entries)) == {"run-b"}

        recorder.let_go("run-a")
        await recorder.until(lambda: len(recorder.started) == 2)
        assert recorder.started[1] == ("run-b", {"queued": 2.5})
        assert await asyncio.to_thread(_length) == 0
        recorder.let_go("run-b")
        await recorder.until(lambda: recorder.running == 0)
        assert recorder.most_at_once == 1
    finally:
        await _stop(lane, serving)


def _entries() -> list[bytes]:
    client = _sync_client()
    try:
        return list(client.lrange(run_lane.lane_key(), 0, -1))
    finally:
        client.close()


async def test_runs_overlap_up_to_the_slots_and_no_further(lane_prefix: str) -> None:
    recorder = Recorder()
    lane = _lane(recorder, slots=3)
    serving = asyncio.ensure_future(lane.serve())
    try:
        for i in range(5):
            await asyncio.to_thread(run_lane.push, f"run-{i}", {"queued": float(i)})
        await recorder.until(lambda: recorder.running == 3)
        assert await asyncio.to_thread(_length) == 2
        for i in range(5):
            recorder.let_go(f"run-{i}")
        await recorder.until(lambda: len(recorder.started) == 5 and recorder.running == 0)
        assert recorder.most_at_once == 3
        assert [run_id for run_id, _ in recorder.started] == [f"run-{i}" for i in range(5)]
    finally:
        await _stop(lane, serving)


async def test_a_malformed_entry_is_logged_and_skipped_and_the_lane_goes_on(
    lane_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()
    lane = _lane(recorder, slots=1)
    client = _sync_client()
    try:
        for raw in (b"not json", json.dumps(["only an id"]), json.dumps([7, {}]), json.dumps(["run-x", "stages"])):
            client.lpush(run_lane.lane_key(), raw)
    finally:
        client.close()
    await asyncio.to_thread(run_lane.push, "run-ok", {"queued": 3.0})
    serving = asyncio.ensure_future(lane.serve())
    try:
        with caplog.at_level(logging.INFO, logger="yimi"):
            await recorder.until(lambda: len(recorder.started) == 1)
        assert recorder.started == [("run-ok", {"queued": 3.0})]
        assert [r.getMessage() for r in caplog.records].count("run_lane_bad_entry") == 4
        recorder.let_go("run-ok")
    finally:
        await _stop(lane, serving)


async def test_an_idle_lane_outlives_its_blocking_pops_and_client_timeouts(lane_prefix: str) -> None:
    """Idle past the 5 s blocking pop (and redis-py's 5 s defaults): the lane's connection
    has no read timeout, each empty pop blocks again, and a run pushed then is taken."""
    recorder = Recorder()
    lane = _lane(recorder, slots=1, block_seconds=run_lane.LANE_BLOCK_SECONDS)  # as on a worker
    serving = asyncio.ensure_future(lane.serve())
    try:
        await asyncio.sleep(run_lane.LANE_BLOCK_SECONDS + 1.5)
        assert not serving.done()
        await asyncio.to_thread(run_lane.push, "run-late", {"queued": 4.0})
        await recorder.until(lambda: len(recorder.started) == 1)
        recorder.let_go("run-late")
    finally:
        await _stop(lane, serving)


class SilentProxy:
    """A TCP proxy to Redis that can go silent: while ``silent`` it forwards nothing back to
    the client, as a half-open connection (a peer gone without a FIN) or a hung Redis would."""

    def __init__(self) -> None:
        self.silent = False
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        target = urlsplit(django_settings.REDIS_URL)
        up_reader, up_writer = await asyncio.open_connection(target.hostname or "127.0.0.1", target.port or 6379)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, back: bool) -> None:
            while data := await source.read(65536):
                if not (back and self.silent):
                    sink.write(data)
                    await sink.drain()

        try:
            await asyncio.gather(pipe(reader, up_writer, False), pipe(up_reader, writer, True))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            up_writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def test_a_lane_whose_connection_goes_silent_makes_a_new_one(lane_prefix: str) -> None:
    """A pop whose answer does not come within the block plus the read margin gives the
    connection up (``run_lane_unreachable``, a timeout); the lane pops again on a new one
    and takes the runs pushed meanwhile. Without the read timeout the lane would wait on the
    silent connection for good."""
    proxy = SilentProxy()
    await proxy.start()
    recorder = Recorder()
    target = urlsplit(django_settings.REDIS_URL)
    url = f"redis://127.0.0.1:{proxy.port}{target.path or '/0'}"
    lane = run_lane.Lane(recorder, slots=1, url=url, key=run_lane.lane_key(), block_seconds=1, read_margin=0.5)
    serving = asyncio.ensure_future(lane.serve())
    try:
        await asyncio.to_thread(run_lane.push, "run-before", {})
        await recorder.until(lambda: len(recorder.started) == 1)
        recorder.let_go("run-before")
        given_up = asyncio.Event()
        errors: list[str] = []

        class Unreachable(logging.Handler):  # the lane logs on this loop: the event is set here
            def emit(self, record: logging.LogRecord) -> None:
                if record.getMessage() == "run_lane_unreachable":
                    errors.append(getattr(record, "yimi_fields", {}).get("error"))
                    given_up.set()

        handler = Unreachable()
        logging.getLogger("yimi").addHandler(handler)
        try:
            proxy.silent = True
            await asyncio.wait_for(given_up.wait(), WAIT)
        finally:
            logging.getLogger("yimi").removeHandler(handler)
        assert "TimeoutError" in errors, errors
        assert not serving.done()
        proxy.silent = False
        await asyncio.to_thread(run_lane.push, "run-after", {})
        await recorder.until(lambda: [run_id for run_id, _ in recorder.started] == ["run-before", "run-after"])
        recorder.let_go("run-after")
    finally:
        proxy.silent = False
        await _stop(lane, serving)
        await proxy.close()


async def test_draining_waits_for_the_runs_in_flight_and_takes_no_more(lane_prefix: str) -> None:
    recorder = Recorder()
    lane = _lane(recorder, slots=2)
    serving = asyncio.ensure_future(lane.serve())
    await asyncio.to_thread(run_lane.push, "run-1", {})
    await recorder.until(lambda: len(recorder.started) == 1)

    draining = asyncio.ensure_future(lane.drain(WAIT))
    await asyncio.wait_for(serving, WAIT)  # popping stopped (its blocked pop ended)
    assert not draining.done()  # run-1 is still in flight
    await asyncio.to_thread(run_lane.push, "run-2", {})
    recorder.let_go("run-1")
    assert await asyncio.wait_for(draining, WAIT) == 0
    assert [run_id for run_id, _ in recorder.started] == ["run-1"]
    assert await asyncio.to_thread(_length) == 1  # run-2 waits for another worker


async def test_a_redis_error_is_logged_and_the_lane_goes_on(lane_prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    """Redis refusing the pop (here WRONGTYPE; MISCONF on a full disk or READONLY after a
    failover alike) is logged and retried: the lane never ends quietly, and takes the next
    run once Redis accepts the pop again."""
    recorder = Recorder()
    client = _sync_client()
    try:
        client.set(run_lane.lane_key(), "not a list")
        lane = _lane(recorder, slots=1)
        serving = asyncio.ensure_future(lane.serve())
        with caplog.at_level(logging.INFO, logger="yimi"):

            async def refused() -> None:
                while "run_lane_unreachable" not in [r.getMessage() for r in caplog.records]:
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(refused(), WAIT)
        assert not serving.done()
        client.delete(run_lane.lane_key())
    finally:
        client.close()
    try:
        await asyncio.to_thread(run_lane.push, "run-after", {"queued": 5.0})
        await recorder.until(lambda: len(recorder.started) == 1)
        assert recorder.started == [("run-after", {"queued": 5.0})]
        recorder.let_go("run-after")
    finally:
        await _stop(lane, serving)


async def test_a_run_that_fails_frees_its_slot(lane_prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []

    async def failing(run_id: str, stages: dict[str, float]) -> None:
        seen.append(run_id)
        raise RuntimeError("boom")

    lane = _lane(failing, slots=1)
    serving = asyncio.ensure_future(lane.serve())
    try:
        with caplog.at_level(logging.INFO, logger="yimi"):
            for name in ("run-1", "run-2"):
                await asyncio.to_thread(run_lane.push, name, {})

            async def both() -> None:
                while len(seen) < 2:
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(both(), WAIT)
        assert seen == ["run-1", "run-2"]  # the failed run gave its one slot back
        assert [r.getMessage() for r in caplog.records].count("run_lane_run_failed") >= 1
    finally:
        await _stop(lane, serving)


def test_publishing_a_run_without_redis_is_logged_and_left_to_the_sweep(settings: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Redis down at admission: the run is stored (the caller's transaction committed), the
    push fails, and publish_run logs it and reports the run as handed to the broker side, so
    the web process does not run it itself; the recovery sweep sends it later."""
    from brain.dispatch import publish_run
    from yimi_project.celery import app

    saved = app.conf.broker_url
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    app.conf.broker_url = "redis://127.0.0.1:1/0"
    try:
        with caplog.at_level(logging.INFO, logger="yimi"):
            assert publish_run("00000000-0000-0000-0000-000000000001") is True
        assert "run_not_queued" in [r.getMessage() for r in caplog.records]
    finally:
        app.conf.broker_url = saved
