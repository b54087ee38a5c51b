"""Round-trip benchmark: how much slower is a text through Yimi than through a bare websocket?

    .venv/bin/python bench/roundtrip.py [--owners 1] [--devices-per-owner 50] [--messages 5] [--workers 1] [--runs 8]
        [--web-processes 1,2] [--speakers K]

Starts an isolated platform (a fresh PostgreSQL database, a temporary data directory, a
unique channel prefix on Redis, daphne and a Celery worker as subprocesses, the fake brain
answering instantly in a thread), pairs ``--owners`` x ``--devices-per-owner`` simulated
devices and has each send M texts one after the other, all devices at once, after one
unmeasured warm-up text each (``--speakers K``: at most K devices mid-text at once, from
sending a text to ACKing its reply; every device stays connected and gets the owner's
fan-out, so ``--speakers 1`` is a household where one device speaks at a time). Latency
is text sent → first ``reply.chunk`` (or
``reply.done``, if every chunk of that reply was lost); throughput is texts / wall time
of the sending phase.

Owners. Yimi is one owner per instance (one ``is_owner`` account), so a hosted load of many owners is
many instances; starting 50 instances (50 daphnes, workers and databases) on one small
machine would measure the machine, not Yimi. ``--owners N`` is simulated instead as N
accounts on one instance: the instance's owner plus N-1 other accounts, each pairing its
own devices (the bench writes their pairing codes directly, since the product issues codes
to the owner only). Each account has its own timeline, its own owner group (its
``timeline.new`` fan-out) and its own runs, on shared daphne, Celery, Redis and PostgreSQL
processes — the shape of a host serving many owners. The difference: another account's
texts are admitted in guest scope (``device_scope_limit``), which the instant fake brain
does not care about. ``--devices`` is the old name of ``--devices-per-owner``.

Delivery. For every text the speaking device waits for ``reply.done``; if it has not come
``--done-timeout`` seconds after the reply began (its first chunk, or the ``text.ack`` if no
chunk came either), the device does what docs/protocol.md says a device does: it syncs
after the utterance's ``seq`` until the reply is there, and checks that the entries it got
have no gap in their sequence numbers. The table counts, per path: ``done`` (``reply.done``
in time), ``late`` (a ``reply.done`` that came after the device had recovered the reply),
``synced`` (recovered by sync with no gap) and ``lost`` (neither; the bench fails). The Yimi figures are taken twice on fresh platforms: as shipped (the main
reply buffered to each sentence end and checked by the deterministic checker before it is
sent) and with ``YIMI_BENCH_UNCHECKED_REPLIES=1`` (deltas forwarded as they come, the
bench-only unchecked path). The same figures are then taken for a bare ``websockets``
echo server (the floor), and the table shows the ratios to it. Under the table, the
stage breakdown of each Yimi path: p50 and p99 of every stage of the measured runs' traces
(``brain.trace``, read from the bench database after the phase).

Workers. ``--workers`` Celery worker processes, started as ``./yimi up`` starts one (thread
pool, ``--runs`` runs at once sharing the process's event loop: ``YIMI_WORKER_RUNS``);
``--pool prefork`` starts them the old way (one run at a time per pool process, ``--runs``
processes), for comparisons. The dispatch floor: after each Yimi phase, 50 no-op tasks
(``brain.tasks.probe_dispatch``) are published one after the other on the same broker and
queue; the row shows publish → a worker started it, which is what Celery dispatch alone
costs a run. Run on demand; it is not part of the test suite.

Dispatch (issue 36, step 3). ``--dispatch lane`` (the default) sends each run as the product
does, on the run lane (``brain.run_lane``). ``--dispatch celery`` is a bench-only switch, not
a product path: it sets ``YIMI_RUN_DISPATCH=celery`` for the web and worker processes, so
``brain.dispatch.publish_run`` sends the run as the Celery task ``brain.tasks.execute_run``
(``brain.tasks.execute_run_task``, ``acks_late=True``) and the worker is started with
``--prefetch-multiplier 1`` (as settings already set it), the same thread pool and
``YIMI_WORKER_RUNS``. A comma-separated list (``--dispatch lane,celery,lane,celery``)
measures each in turn, on a fresh platform each, in one sitting; each CPU table prints the
load average (``/proc/loadavg``) before and after its phase.

Channel layer (issue 36, step 3). ``--channel-layer yimi`` (the default) is the product's
(``yimi_project.infra.channel_layers.RedisChannelLayer``); ``--channel-layer stock`` is a
bench-only switch (``YIMI_BENCH_CHANNEL_LAYER=stock``, read by settings) that runs the web
and worker processes on ``channels_redis.core.RedisChannelLayer`` as shipped, with the same
hosts, capacities and socket timeout. Comma-separated, like ``--dispatch``; with both lists
the phases run in pairs (lane/yimi, celery/stock, ...: the lists are zipped, the shorter repeated).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import redis  # noqa: E402
from websockets.asyncio.client import connect as ws_connect  # noqa: E402
from websockets.asyncio.server import ServerConnection, serve  # noqa: E402

from bench.support import free_port, recreate_database  # noqa: E402
from devices.simulator import ConnectionLost, DeviceConnection, SimulatorError, pair  # noqa: E402
from llm.fake_server import FakeBrainServer, Rule, Script  # noqa: E402

BIN = Path(sys.executable).parent
REPLY = "Here is the benchmark reply. It comes in a few chunks, one sentence at a time."  # passes the checker
FRAME_TIMEOUT = 60.0  # longest wait for any single frame




def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {args[0]} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


PAIRING_CODES = """
import secrets
from datetime import timedelta
from django.utils import timezone
from accounts.models import User
from accounts.services import get_owner
from accounts.models import PairingCode
from accounts.devices import _digest, CODE_ALPHABET, CODE_LENGTH, format_code, issue_pairing_code
owner = get_owner()
for o in range(OWNERS):
    if o == 0:
        codes = [issue_pairing_code(owner)[1] for _ in range(PER_OWNER)]
    else:  # another account of this instance, standing in for another owner (see the docstring)
        account = User.objects.create_user(username=f"bench-owner-{o}", password=secrets.token_urlsafe(12))
        codes = []
        for _ in range(PER_OWNER):
            raw = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
            PairingCode.objects.create(owner=account, digest=_digest(raw), expires_at=timezone.now() + timedelta(hours=1))
            codes.append(format_code(raw))
    print(o, " ".join(codes))
"""


def pairing_codes(env: dict[str, str], owners: int, per_owner: int) -> list[list[str]]:
    """Pairing codes, ``per_owner`` for each of ``owners`` accounts (the first is the owner)."""
    script = PAIRING_CODES.replace("OWNERS", str(owners)).replace("PER_OWNER", str(per_owner))
    out: list[list[str]] = []
    for line in manage(env, "shell", "-c", script).splitlines():
        parts = line.split()
        if parts and parts[0].isdigit() and all(re.fullmatch(r"[0-9A-Z]{4}-[0-9A-Z]{4}", c) for c in parts[1:]):
            out.append(parts[1:])
    if len(out) != owners or any(len(codes) != per_owner for codes in out):
        raise RuntimeError(f"expected {owners} x {per_owner} pairing codes")
    return out


def forget_redis_keys(url: str, prefix: str) -> None:
    """Remove this run's channel groups and Celery queue bindings from Redis."""
    client = redis.Redis.from_url(url, socket_timeout=10)
    try:
        for pattern in (f"{prefix}:*", f"{prefix}-tasks*", f"_kombu.binding*.{prefix}-tasks"):
            for key in client.scan_iter(pattern):
                client.delete(key)
    except redis.RedisError as exc:
        print(f"could not clean up Redis keys {prefix}:*: {exc}", file=sys.stderr)
    finally:
        client.close()


def wait_healthy(base: str, procs: list[subprocess.Popen[bytes]], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("daphne or the Celery worker exited during start-up")
        try:
            if httpx.get(base + "/api/health/", timeout=1).json().get("channel_layer") == "redis":
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"daphne was not healthy within {timeout:.0f} s")


class Delivery:
    """Per path: how each text's reply reached the device that spoke."""

    def __init__(self) -> None:
        self.done = self.late = self.synced = self.lost = self.gaps = 0
        self.recovered: set[tuple[int, int]] = set()  # (device index, utterance seq) recovered by sync


async def recover_by_sync(conn: DeviceConnection, seq: int, limit: float) -> dict[str, Any] | None:
    """Sync after ``seq`` (as a device that missed frames does) until the reply to ``seq`` is
    there; returns it and whether the entries had a gap, or None by ``limit``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while loop.time() < deadline:
        try:
            entries = await conn.sync(after=seq, limit=200)
        except ConnectionLost:
            raise
        except SimulatorError:  # the page took longer than the simulator waits (10 s): ask again
            continue
        reply = next((e for e in entries if e["reply_to_seq"] == seq and e["kind"] in ("reply", "notice")), None)
        if reply is not None:
            seqs = [e["seq"] for e in entries]
            reply["_gap"] = seqs != list(range(seq + 1, seq + 1 + len(seqs)))
            return reply
        await asyncio.sleep(0.5)
    return None


async def converse(conn: DeviceConnection, texts: int, latencies: list[float] | None, delivery: Delivery | None = None,
                   *, device: int = 0, done_timeout: float = 10.0, turns: asyncio.Semaphore | None = None) -> None:
    """Send ``texts`` texts one after the other; record send → first reply frame, and how
    the reply reached this device (``Delivery``). ``turns``: held from a text's send to its
    ACK, so at most that many devices are mid-text at once (``--speakers``)."""
    delivery = delivery or Delivery()
    for i in range(texts):
        async with turns or contextlib.nullcontext():
            await _one_text(conn, i, latencies, delivery, device=device, done_timeout=done_timeout)


async def _one_text(conn: DeviceConnection, i: int, latencies: list[float] | None, delivery: Delivery,
                    *, device: int, done_timeout: float) -> None:
    loop = asyncio.get_running_loop()
    client_id, seq, first = uuid.uuid4().hex, None, None
    started = time.perf_counter()
    await conn.send({"type": "text", "id": client_id, "text": f"benchmark text {i}"})
    final: dict[str, Any] | None = None
    began = loop.time()
    while final is None:
        # Until the ack: no limit but FRAME_TIMEOUT. After it: done_timeout since the reply began.
        wait = FRAME_TIMEOUT if seq is None else max(0.0, began + done_timeout - loop.time())
        try:
            frame = await conn.next_frame("text.ack", "reply.chunk", "reply.done", "notice", "error", timeout=wait or 0.001)
        except SimulatorError:
            if seq is None:
                raise
            break  # no reply.done in time: recover by sync below
        if frame["type"] in ("text.ack", "error") and frame.get("id") == client_id:
            if frame["type"] == "error":
                raise SimulatorError(f"{frame['code']}: {frame['message']}")
            seq, began = frame["seq"], loop.time()
        elif frame["type"] == "reply.done" and (device, frame.get("reply_to_seq")) in delivery.recovered:
            delivery.late += 1  # an earlier text's reply.done, after the device had synced it
        elif seq is not None and frame.get("reply_to_seq") == seq:
            if frame["type"] == "notice":
                raise SimulatorError(f"a notice instead of a reply: {frame['text']}")
            if first is None:
                first, began = time.perf_counter() - started, loop.time()
            if frame["type"] == "reply.done":
                final = frame
                delivery.done += 1
    if final is None:
        assert seq is not None
        reply = await recover_by_sync(conn, seq, FRAME_TIMEOUT)
        if reply is None:
            delivery.lost += 1
            raise SimulatorError(f"the reply to seq {seq} neither arrived nor could be synced")
        delivery.synced += 1
        delivery.gaps += int(reply["_gap"])
        delivery.recovered.add((device, seq))
        final = reply
    if latencies is not None and first is not None:
        latencies.append(first)
    await conn.ack(final["seq"])


async def timed(clients: list[Callable[[], Awaitable[None]]], limit: float) -> float:
    """Run all clients at once; returns the wall time in seconds."""
    started = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(c() for c in clients)), limit)
    return time.perf_counter() - started


async def yimi_phase(base: str, codes: list[list[str]], messages: int, limit: float,
                     done_timeout: float, cpu: CpuMeter, speakers: int | None = None) -> tuple[list[float], float, Delivery]:
    flat = [(o, c) for o, owner_codes in enumerate(codes) for c in owner_codes]
    # Fewer pairings at once than the 5 guesses per address the server counts before it looks at a code.
    pairing = asyncio.Semaphore(4)

    async def pair_one(code: str, name: str) -> Any:
        async with pairing:
            return await pair(base, code, name=name)

    identities = await asyncio.wait_for(
        asyncio.gather(*(pair_one(c, f"bench {o}.{i}") for i, (o, c) in enumerate(flat))), 300
    )
    conns = [DeviceConnection(identity) for identity in identities]
    try:
        await asyncio.wait_for(asyncio.gather(*(c.connect() for c in conns)), 120)
        # Warm-up (not measured): one text per device, so worker processes and connections exist.
        await timed([lambda c=c, d=d: converse(c, 1, None, device=d, done_timeout=done_timeout)
                     for d, c in enumerate(conns)], limit)
        latencies: list[float] = []
        delivery = Delivery()
        turns = asyncio.Semaphore(speakers) if speakers else None
        cpu.start()
        wall = await timed([lambda c=c, d=d: converse(c, messages, latencies, delivery, device=d, done_timeout=done_timeout,
                                                      turns=turns)
                            for d, c in enumerate(conns)], limit)
        cpu.stop()
        return latencies, wall, delivery
    finally:
        await asyncio.wait_for(asyncio.gather(*(c.close() for c in conns), return_exceptions=True), 30)


async def echo_phase(devices: int, messages: int, limit: float) -> tuple[list[float], float]:
    async def echo(ws: ServerConnection) -> None:
        async for message in ws:
            await ws.send(message)

    latencies: list[float] = []

    async def client(ws: Any) -> None:
        for i in range(messages):
            started = time.perf_counter()
            await ws.send(json.dumps({"type": "text", "id": uuid.uuid4().hex, "text": f"benchmark text {i}"}))
            await asyncio.wait_for(ws.recv(), FRAME_TIMEOUT)
            latencies.append(time.perf_counter() - started)

    async with serve(echo, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        sockets = await asyncio.wait_for(
            asyncio.gather(*(ws_connect(f"ws://127.0.0.1:{port}") for _ in range(devices))), 60
        )
        try:
            wall = await timed([lambda ws=ws: client(ws) for ws in sockets], limit)
        finally:
            await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    return latencies, wall


def _cpu_ms(pid: int) -> float:
    """Used CPU of one process (user + system, its threads included), in ms; 0 if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def _processes() -> dict[int, tuple[str, int]]:
    """Every process on the machine: pid → (command name, parent pid)."""
    out: dict[int, tuple[str, int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                head, tail = (entry / "stat").read_text().rsplit(")", 1)
            except OSError:
                continue
            out[int(entry.name)] = (head.split("(", 1)[1], int(tail.split()[1]))
    return out


class CpuMeter:
    """CPU used during the measured phase, by part: the web and worker processes the bench
    started (with their children), every ``postgres`` and ``redis-server`` process on the
    machine, and the bench itself (its device clients and the fake brain's thread). Read
    from /proc before and after, so it shows where the round trip's CPU goes on a 2-core
    machine, where CPU, not waiting, is what queues the texts."""

    def __init__(self, started: dict[str, int]) -> None:
        self.started = started  # part name → pid of a process the bench started
        self.before: dict[str, float] = {}
        self.used: dict[str, float] = {}
        self.wall = 0.0

    def _sample(self) -> dict[str, float]:
        procs = _processes()
        parts: dict[str, set[int]] = {name: {pid} for name, pid in self.started.items()}
        for pids in parts.values():  # children (daphne's own, a prefork pool's)
            grown = True
            while grown:
                kids = {p for p, (_, ppid) in procs.items() if ppid in pids} - pids
                grown = bool(kids)
                pids |= kids
        parts["postgres"] = {p for p, (comm, _) in procs.items() if comm == "postgres"}
        parts["redis"] = {p for p, (comm, _) in procs.items() if comm.startswith("redis-server")}
        parts["bench (clients, fake brain)"] = {os.getpid()}
        return {name: sum(_cpu_ms(p) for p in pids) for name, pids in parts.items()}

    def start(self) -> None:
        self.load_before = load()
        self.before, self.wall = self._sample(), time.perf_counter()

    def stop(self) -> None:
        self.load_after = load()
        after, self.wall = self._sample(), time.perf_counter() - self.wall
        self.used = {name: after[name] - self.before.get(name, 0.0) for name in after}

    def lines(self, texts: int) -> list[str]:
        total = sum(self.used.values())
        lines = [f"  {'part':<40}{'CPU ms/text':>12}{'share':>8}"]
        for name, ms in sorted(self.used.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {name:<40}{ms / texts:>12.2f}{ms / total * 100 if total else 0:>7.0f}%")
        lines.append(f"  {'all (cores busy: ' + format(total / 1000 / self.wall, '.2f') + ')':<40}{total / texts:>12.2f}")
        lines.append(f"  load average (1 min) before/after the phase: {self.load_before}/{self.load_after}")
        return lines


def worker_commands(args: argparse.Namespace, dispatch: str = "lane") -> list[tuple[str, list[str]]]:
    """``--workers`` worker processes, each started as ``./yimi up`` starts one (``--pool threads``);
    with ``--dispatch celery``, also ``--prefetch-multiplier 1`` (settings' value, said out loud)."""
    pool = ["--pool", "threads"] if args.pool == "threads" else ["--pool", "prefork"]
    prefetch = ["--prefetch-multiplier", "1"] if dispatch == "celery" else []
    return [(f"celery{w}", [str(BIN / "celery"), "-A", "yimi_project", "worker", "--loglevel=WARNING", *pool,
                            f"--concurrency={args.runs}", *prefetch, "-n", f"bench{w}@%h"]) for w in range(args.workers)]


def load() -> str:
    """The 1-minute load average (other processes share the machine)."""
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except (OSError, IndexError):
        return "?"


def web_commands(processes: int, port: int) -> list[tuple[str, list[str]]]:
    """One daphne, or ``processes`` web processes on one port as ``./yimi up`` starts them
    with ``YIMI_WEB_PROCESSES`` (``yimi_project.web_processes``: SO_REUSEPORT, the kernel
    spreads the devices' connections over them)."""
    if processes == 1:
        return [("daphne", [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "yimi_project.asgi:application"])]
    serve = [sys.executable, "-m", "yimi_project.web_processes", "serve", "127.0.0.1", str(port)]
    return [(f"daphne{i}", serve) for i in range(processes)]


def run_yimi(args: argparse.Namespace, data_dir: Path, *, unchecked: bool = False,
             web_processes: int = 1, dispatch: str = "lane", layer: str = "yimi") -> tuple[list[float], float, Delivery, list[float], CpuMeter]:
    recreate_database(args.database_url)
    brain = FakeBrainServer(script=Script(rules=[Rule(reply=REPLY, chunk_chars=16, delay_ms=0)]))
    brain.start_in_thread()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "yimi_project.settings",
        "DATABASE_URL": args.database_url,
        "REDIS_URL": args.redis_url,
        "YIMI_CHANNEL_PREFIX": f"yimi-bench-{uuid.uuid4().hex[:8]}",
        "YIMI_DATA_DIR": str(data_dir),
        "YIMI_BRAIN_BASE_URL": brain.base_url,
        "YIMI_BRAIN_MODEL": "yimi-demo",  # llm.roles: a base URL needs a model name
        "PYTHONUNBUFFERED": "1",
        "YIMI_BENCH_UNCHECKED_REPLIES": "1" if unchecked else "0",
        "YIMI_WORKER_RUNS": str(args.runs),
        "YIMI_RUN_DISPATCH": dispatch,  # bench-only switch (brain.dispatch.publish_run): lane or celery
        "YIMI_BENCH_CHANNEL_LAYER": layer,  # bench-only switch (settings): yimi or stock (channels_redis as shipped)
    }
    procs: list[subprocess.Popen[bytes]] = []
    try:
        manage(env, "yimi_init", "--no-pairing-code")
        codes = pairing_codes(env, args.owners, args.devices_per_owner)
        port = free_port()
        commands = [*web_commands(web_processes, port), *worker_commands(args, dispatch)]
        for name, cmd in commands:
            with open(data_dir / f"{name}.log", "wb") as log:  # the child keeps its own descriptor
                procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base, procs)
        cpu = CpuMeter({name: p.pid for (name, _), p in zip(commands, procs)})
        latencies, wall, delivery = asyncio.run(yimi_phase(base, codes, args.messages, args.timeout, args.done_timeout, cpu,
                                                           args.speakers))
        return latencies, wall, delivery, dispatch_floor(args.redis_url, env["YIMI_CHANNEL_PREFIX"]), cpu
    except BaseException:
        for name in (n for n, _ in [*web_commands(web_processes, 0), *worker_commands(args, dispatch)]):
            path = data_dir / f"{name}.log"
            if path.exists():
                print(f"--- end of {name}.log ---\n{path.read_text(errors='replace')[-3000:]}", file=sys.stderr)
        raise
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        brain.shutdown()
        brain.server_close()
        forget_redis_keys(args.redis_url, env["YIMI_CHANNEL_PREFIX"])


def dispatch_floor(redis_url: str, prefix: str, count: int = 50) -> list[float]:
    """Publish → pickup of ``count`` no-op tasks, one at a time, in seconds (the worker
    writes the time it started the task to a Redis list the bench waits on)."""
    from celery import Celery

    app = Celery("yimi-bench", broker=redis_url)
    app.conf.broker_connection_retry_on_startup = True
    client = redis.Redis.from_url(redis_url, socket_timeout=30)
    key = f"{prefix}:bench-probe"
    out: list[float] = []
    try:
        for i in range(count + 3):  # the first three warm the publisher's connection: not counted
            sent_ms = time.time() * 1000
            app.send_task("brain.tasks.probe_dispatch", args=[key], queue=f"{prefix}-tasks")
            popped = client.blpop([key], timeout=FRAME_TIMEOUT)
            if popped is None:
                raise RuntimeError("no worker picked up the no-op task")
            if i >= 3:
                out.append(max(0.0, float(popped[1]) - sent_ms) / 1000)
    finally:
        client.delete(key)
        client.close()
        app.close()
    return out


def figures(latencies: list[float], wall: float) -> tuple[float, float, float, float]:
    cuts = statistics.quantiles([x * 1000 for x in latencies], n=100, method="inclusive")
    return cuts[49], cuts[94], cuts[98], len(latencies) / wall


def ratio(value: float) -> str:
    return f"x{value:.1f}" if value >= 1 else f"x{value:.3f}"


def stage_breakdown(database_url: str, measured: int) -> list[str]:
    """The trace (``brain.trace``) of the last ``measured`` runs (the measured texts; the
    warm-up runs came before them), read from the bench database after the phase: per
    stage, the time since the stage before it, p50 and p99 in ms, and how many runs
    recorded it (a stage missing from a run is left out, not counted as zero; an ACK still
    in flight when the sockets closed is missing)."""
    import psycopg

    from brain.trace import LABELS, STAGES, stage_durations

    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT trace FROM brain_run WHERE trace IS NOT NULL ORDER BY created_at").fetchall()
    traces = [row[0] for row in rows][-measured:] if measured else []
    per_stage: dict[str, list[float]] = {stage: [] for stage in (*STAGES[1:], "total")}
    for trace in traces:
        for stage, ms in stage_durations(trace).items():
            per_stage[stage].append(ms)
    lines = [f"  {'stage (time since the stage before)':<40}{'runs':>6}{'p50 ms':>9}{'p99 ms':>9}"]
    for stage, values in per_stage.items():
        label = "first to last stage" if stage == "total" else LABELS[stage]
        if not values:
            lines.append(f"  {label:<40}{0:>6}{'missing':>9}{'missing':>9}")
            continue
        cuts = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else [values[0]] * 99
        lines.append(f"  {label:<40}{len(values):>6}{cuts[49]:>9.2f}{cuts[98]:>9.2f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--owners", type=int, default=1, help="accounts, each with its own devices (see the docstring)")
    parser.add_argument("--devices-per-owner", "--devices", dest="devices_per_owner", type=int, default=50)
    parser.add_argument("--messages", type=int, default=5, help="texts per device")
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/yimi_bench")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--workers", type=int, default=1, help="Celery worker processes")
    parser.add_argument("--runs", type=int, default=8, help="runs at once per worker process (YIMI_WORKER_RUNS)")
    parser.add_argument("--pool", choices=("threads", "prefork"), default="threads",
                        help="threads: as ./yimi up starts a worker; prefork: the old way, --runs processes")
    parser.add_argument("--timeout", type=float, default=600.0, help="limit for each sending phase, seconds")
    parser.add_argument("--done-timeout", type=float, default=10.0,
                        help="seconds a device waits for reply.done after the reply began before it syncs")
    parser.add_argument("--checked-only", action="store_true", help="skip the unchecked (bench switch) path")
    parser.add_argument("--speakers", type=int, default=None,
                        help="devices mid-text at once (default: all; 1 = a household where one device speaks at a time "
                             "while every device stays connected and gets the fan-out)")
    parser.add_argument("--dispatch", default="lane",
                        help="how a run reaches the worker, comma-separated to alternate in one sitting: lane (the "
                             "product's run lane) or celery (bench-only switch: the Celery task, acks late, prefetch 1)")
    parser.add_argument("--channel-layer", default="yimi",
                        help="the channel layer, comma-separated to alternate in one sitting: yimi (the product's) or "
                             "stock (bench-only switch: channels_redis as shipped)")
    parser.add_argument("--web-processes", default="1",
                        help="web processes to measure, comma-separated (e.g. 1,2: one table row each, same run)")
    args = parser.parse_args()
    try:
        web_counts = [int(n) for n in args.web_processes.split(",")]
    except ValueError:
        parser.error("--web-processes takes whole numbers separated by commas, e.g. 1,2")
    if not web_counts or min(web_counts) < 1:
        parser.error("--web-processes: each count must be 1 or more")
    devices = args.owners * args.devices_per_owner
    if args.owners < 1 or args.devices_per_owner < 1 or args.messages < 1 or devices * args.messages < 2:
        parser.error("need at least two texts in all (--owners x --devices-per-owner x --messages)")
    dispatches = args.dispatch.split(",")
    if not dispatches or any(d not in ("lane", "celery") for d in dispatches):
        parser.error("--dispatch takes lane or celery, comma-separated")
    layers = args.channel_layer.split(",")
    if not layers or any(name not in ("yimi", "stock") for name in layers):
        parser.error("--channel-layer takes yimi or stock, comma-separated")
    turns = max(len(dispatches), len(layers))
    setups = [(dispatches[t % len(dispatches)], layers[t % len(layers)]) for t in range(turns)]
    if args.speakers is not None and args.speakers < 1:
        parser.error("--speakers must be 1 or more")

    rows: list[tuple[str, tuple[float, float, float, float], Delivery | None]] = []
    probes: list[float] = []
    stages: list[tuple[str, list[str]]] = []
    cpus: list[tuple[str, list[str]]] = []
    for web, (turn, (how, layer)) in itertools.product(web_counts, enumerate(setups)):
        for unchecked in (False, True) if not args.checked_only else (False,):
            label = "yimi, unchecked (bench switch)" if unchecked else "yimi, checked (as shipped)"
            if web > 1:
                label = f"yimi, {'unchecked' if unchecked else 'checked'}, {web} web procs"
            if len(setups) > 1 or how != "lane" or layer != "yimi":
                label = f"{label.split(' (')[0]}, {how}/{layer} #{turn + 1}"
            with tempfile.TemporaryDirectory(prefix="yimi-bench-") as tmp:
                latencies, wall, delivery, probed, cpu = run_yimi(args, Path(tmp), unchecked=unchecked, web_processes=web,
                                                                  dispatch=how, layer=layer)
                cpus.append((label, cpu.lines(len(latencies))))
                probes += probed
                rows.append((label, figures(latencies, wall), delivery))
                stages.append((label, stage_breakdown(args.database_url, len(latencies))))
    echo_load, echo_cpu = load(), time.process_time()
    echo_latencies, echo_wall = asyncio.run(echo_phase(devices, args.messages, args.timeout))
    echo_cpu = (time.process_time() - echo_cpu) * 1000 / len(echo_latencies)  # server and clients: this process
    echo = figures(echo_latencies, echo_wall)
    rows.append(("bare websockets echo (floor)", echo, None))
    cpus.append(("bare websockets echo (floor)", [f"  {'all (server and clients, one process)':<40}{echo_cpu:>12.2f}",
                                                   f"  load average (1 min) before/after the phase: {echo_load}/{load()}"]))
    dispatch = figures(probes, sum(probes))  # its rate: one task at a time, back to back
    rows.append(("celery no-op task (dispatch floor)", dispatch, None))

    print(f"roundtrip: {args.owners} owners x {args.devices_per_owner} devices x {args.messages} texts "
          f"({args.workers} worker(s), {args.pool} pool, {args.runs} runs at once each, web processes {args.web_processes}, "
          f"{'all devices' if not args.speakers else args.speakers} speaking at once, "
          "fake brain answering instantly)")
    print(f"{'path':<34}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'msgs/s':>10}{'done':>7}{'late':>6}{'synced':>8}{'gaps':>6}{'lost':>6}")
    for label, row, dl in rows:
        counts = "" if dl is None else f"{dl.done:>7}{dl.late:>6}{dl.synced:>8}{dl.gaps:>6}{dl.lost:>6}"
        print(f"{label:<34}" + "".join(f"{v:>9.2f}" for v in row[:3]) + f"{row[3]:>10.1f}" + counts)
    for label, row, dl in rows:
        if dl is None:
            continue
        ratios = [ratio(a / b) for a, b in zip(row, echo)]
        print(f"{'overhead ' + label.split(' (')[0].removeprefix('yimi, ') + ' / echo':<34}"
              + "".join(f"{r:>9}" for r in ratios[:3]) + f"{ratios[3]:>10}")
        ratios = [ratio(a / b) for a, b in zip(row[:3], dispatch[:3])]
        print(f"{'overhead ' + label.split(' (')[0].removeprefix('yimi, ') + ' / dispatch':<34}"
              + "".join(f"{r:>9}" for r in ratios))
    for label, lines in stages:
        print(f"stage breakdown, {label} (from the runs' traces):")
        print("\n".join(lines))
    for label, lines in cpus:
        print(f"CPU per text, {label} (measured phase, from /proc):")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
