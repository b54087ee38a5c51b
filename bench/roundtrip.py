"""Round-trip benchmark: how much slower is a text through Yimi than through a bare websocket?

    .venv/bin/python bench/roundtrip.py [--devices 50] [--messages 5] [--workers 4]

Starts an isolated platform (a fresh PostgreSQL database, a temporary data directory, a
unique channel prefix on Redis, daphne and a Celery worker as subprocesses, the fake brain
answering instantly in a thread), pairs N simulated devices and has each send M texts
one after the other, all devices at once, after one unmeasured warm-up text each.
Latency is text sent → first ``reply.chunk``; throughput is texts / wall time of the
sending phase. The Yimi figures are taken twice on fresh platforms: as shipped (the main
reply buffered to each sentence end and checked by the deterministic checker before it is
sent) and with ``YIMI_BENCH_UNCHECKED_REPLIES=1`` (deltas forwarded as they come, the
bench-only unchecked path). The same figures are then taken for a bare ``websockets``
echo server (the floor), and the table shows the ratios to it. Run on demand; it is not
part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
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
from brain.fake_server import FakeBrainServer, Rule, Script  # noqa: E402
from devices.simulator import DeviceConnection, SimulatorError, pair  # noqa: E402

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


def pairing_codes(env: dict[str, str], n: int) -> list[str]:
    code = (
        "from accounts.services import get_owner; from devices.services import issue_pairing_code; "
        f"o = get_owner(); print('\\n'.join(issue_pairing_code(o)[1] for _ in range({n})))"
    )
    codes = re.findall(r"^[0-9A-Z]{4}-[0-9A-Z]{4}$", manage(env, "shell", "-c", code), re.M)
    if len(codes) != n:
        raise RuntimeError(f"expected {n} pairing codes, got {len(codes)}")
    return codes


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


async def converse(conn: DeviceConnection, texts: int, latencies: list[float] | None) -> None:
    """Send ``texts`` texts one after the other; record send → first reply chunk."""
    for i in range(texts):
        client_id, seq = uuid.uuid4().hex, None
        started = time.perf_counter()
        await conn.send({"type": "text", "id": client_id, "text": f"benchmark text {i}"})
        while True:
            frame = await conn.next_frame("text.ack", "reply.chunk", "notice", "error", timeout=FRAME_TIMEOUT)
            if frame["type"] in ("text.ack", "error") and frame.get("id") == client_id:
                if frame["type"] == "error":
                    raise SimulatorError(f"{frame['code']}: {frame['message']}")
                seq = frame["seq"]
            elif seq is not None and frame.get("reply_to_seq") == seq:
                if frame["type"] == "notice":
                    raise SimulatorError(f"a notice instead of a reply: {frame['text']}")
                break
        if latencies is not None:
            latencies.append(time.perf_counter() - started)
        _, final = await conn.reply_to(seq, timeout=FRAME_TIMEOUT)
        if final["type"] != "reply.done":
            raise SimulatorError(f"a notice instead of a reply: {final['text']}")
        await conn.ack(final["seq"])


async def timed(clients: list[Callable[[], Awaitable[None]]], limit: float) -> float:
    """Run all clients at once; returns the wall time in seconds."""
    started = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(c() for c in clients)), limit)
    return time.perf_counter() - started


async def yimi_phase(base: str, codes: list[str], messages: int, limit: float) -> tuple[list[float], float]:
    identities = await asyncio.wait_for(
        asyncio.gather(*(pair(base, c, name=f"bench {i}") for i, c in enumerate(codes))), 120
    )
    conns = [DeviceConnection(identity) for identity in identities]
    try:
        await asyncio.wait_for(asyncio.gather(*(c.connect() for c in conns)), 120)
        # Warm-up (not measured): one text per device, so worker processes and connections exist.
        await timed([lambda c=c: converse(c, 1, None) for c in conns], limit)
        latencies: list[float] = []
        wall = await timed([lambda c=c: converse(c, messages, latencies) for c in conns], limit)
        return latencies, wall
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


def run_yimi(args: argparse.Namespace, data_dir: Path, *, unchecked: bool = False) -> tuple[list[float], float]:
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
        "PYTHONUNBUFFERED": "1",
        "YIMI_BENCH_UNCHECKED_REPLIES": "1" if unchecked else "0",
    }
    procs: list[subprocess.Popen[bytes]] = []
    try:
        manage(env, "yimi_init", "--no-pairing-code")
        codes = pairing_codes(env, args.devices)
        port = free_port()
        for name, cmd in (
            ("daphne", [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "yimi_project.asgi:application"]),
            ("celery", [str(BIN / "celery"), "-A", "yimi_project", "worker", "--loglevel=WARNING",
                        f"--concurrency={args.workers}"]),
        ):
            with open(data_dir / f"{name}.log", "wb") as log:  # the child keeps its own descriptor
                procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base, procs)
        return asyncio.run(yimi_phase(base, codes, args.messages, args.timeout))
    except BaseException:
        for name in ("daphne", "celery"):
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


def figures(latencies: list[float], wall: float) -> tuple[float, float, float, float]:
    cuts = statistics.quantiles([x * 1000 for x in latencies], n=100, method="inclusive")
    return cuts[49], cuts[94], cuts[98], len(latencies) / wall


def ratio(value: float) -> str:
    return f"x{value:.1f}" if value >= 1 else f"x{value:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=50)
    parser.add_argument("--messages", type=int, default=5, help="texts per device")
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/yimi_bench")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--workers", type=int, default=4, help="Celery worker concurrency")
    parser.add_argument("--timeout", type=float, default=600.0, help="limit for each sending phase, seconds")
    args = parser.parse_args()
    if args.devices < 1 or args.messages < 1 or args.devices * args.messages < 2:
        parser.error("need at least two texts in all (--devices x --messages)")

    with tempfile.TemporaryDirectory(prefix="yimi-bench-") as tmp:
        yimi = figures(*run_yimi(args, Path(tmp)))
    with tempfile.TemporaryDirectory(prefix="yimi-bench-") as tmp:
        unchecked = figures(*run_yimi(args, Path(tmp), unchecked=True))
    echo = figures(*asyncio.run(echo_phase(args.devices, args.messages, args.timeout)))

    print(f"roundtrip: {args.devices} devices x {args.messages} texts "
          f"(celery concurrency {args.workers}, fake brain answering instantly)")
    print(f"{'path':<34}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'msgs/s':>10}")
    rows = (("yimi, checked (as shipped)", yimi), ("yimi, unchecked (bench switch)", unchecked),
            ("bare websockets echo (floor)", echo))
    for label, row in rows:
        print(f"{label:<34}" + "".join(f"{v:>9.2f}" for v in row[:3]) + f"{row[3]:>10.1f}")
    for label, row in (("overhead checked / echo", yimi), ("overhead unchecked / echo", unchecked)):
        ratios = [ratio(a / b) for a, b in zip(row, echo)]
        print(f"{label:<34}" + "".join(f"{r:>9}" for r in ratios[:3]) + f"{ratios[3]:>10}")


if __name__ == "__main__":
    main()
