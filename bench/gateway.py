"""Gateway benchmark: decide + receipt per call, in process and over loopback HTTP, beside the SQL floor.

    .venv/bin/python bench/gateway.py [--calls 10000] [--database-url postgres://...]
                                      [--show-queries] [--profile N] [--no-http]

Uses a fresh PostgreSQL database (``yimi_bench_gateway`` by default, dropped and created),
one owner, one device, one run, and the test pack ``demo``. Each call is a ``decide`` for
an observe tool with distinct arguments followed by a ``receipt`` for it, so every call
writes a ToolCall and a ReceiptRecord. In process it calls the services directly; over
HTTP it posts to daphne's internal Unix socket with one keep-alive client, and then the same
through the platform's own client (``capabilities.client.HttpTransport``: its event loop's
keep-alive client, as a sub-agent with ``YIMI_GATEWAY_OVER_HTTP`` uses it).

The floor is measured in the same run, on the same connection, as raw SQL: ``SELECT 1``,
one INSERT with its commit, and the minimum SQL for decide + receipt — the run lookup that
binds the call, the call's INSERT (committed), the call lookup the receipt must do and the
receipt's INSERT (committed): four statements, each its own transaction. All rows are
measured interleaved, in blocks, so a busy machine slows them alike; the ratio column is
each figure over the minimum SQL's. Under the table: the queries one decide + receipt
issues (``CaptureQueriesContext``), and with ``--profile N`` a cProfile (pyinstrument if it
is installed) of N in-process calls. The product allows 3 s per decide; the goals are
in-process p99 <= 3 x the minimum SQL's p99, and p99 <= 15 ms over loopback.

The ORM row (issue 36, step 3; bench-only, ``--no-orm`` skips it): the same in-process
decide + receipt with ``yimi_project.infra.statements``' ``insert`` and ``fetch_by_pk``
replaced, for that row's calls only, by what they stand for in the ORM
(``obj.save(force_insert=True)`` and ``Model.objects.only(...).get(pk=...)``), interleaved
with the other rows, so the two ways are compared in the same sitting against the same floor.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import free_port, percentile, recreate_database  # noqa: E402

BLOCK = 50  # calls per row per turn when the rows are interleaved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000, help="calls per row")
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/yimi_bench_gateway")
    parser.add_argument("--show-queries", action="store_true", help="print the SQL of one decide + receipt")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="profile N in-process calls after the table")
    parser.add_argument("--no-http", action="store_true", help="skip the loopback HTTP row (no daphne)")
    parser.add_argument("--no-orm", action="store_true", help="skip the ORM row (statements replaced by the ORM)")
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="yimi-bench-gw-"))
    packs_dir = data_dir / "packs"
    packs_dir.mkdir()
    recreate_database(args.database_url)
    os.environ.update(
        DJANGO_SETTINGS_MODULE="yimi_project.settings",
        DATABASE_URL=args.database_url,
        YIMI_DATA_DIR=str(data_dir),
        YIMI_PACKS_DIR=str(packs_dir),
    )
    os.environ.pop("REDIS_URL", None)

    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tests.conftest import pairing_payload
    from tests.support.gateway_support import write_pack

    write_pack(packs_dir, "demo")
    call_command("migrate", verbosity=0)

    from accounts.devices import PairingRequest, issue_pairing_code, pair_device
    from accounts.services import ensure_owner
    from brain.services import accept_utterance
    from capabilities.services import CallRequest, decide, record_receipt

    owner = ensure_owner("owner", "benchmark-password").user  # type: ignore[union-attr]
    _, code = issue_pairing_code(owner)
    body, _ = pairing_payload(code)
    device = pair_device(PairingRequest.from_payload(body), client_ip="127.0.0.1")
    run_id = str(accept_utterance(device, "bench", "benchmark").run_id)
    result = {"receipt_schema": 1, "status": "succeeded", "values": [{"name": "answer", "value": 42, "unit": "unit", "source": "bench"}]}

    def in_process(i: int) -> None:
        decision = decide(CallRequest(run_id, "demo__read", {"key": f"p{i}"}))
        assert decision.decision == "allow", decision
        record_receipt(decision.call_id, result)

    floors = sql_floor(connection, run_id, owner.pk)
    rows: list[tuple[str, Callable[[int], None]]] = [
        ("SELECT 1 (floor)", floors["select"]),
        ("INSERT + commit (floor)", floors["insert"]),
        ("minimum SQL for it (floor)", floors["minimum"]),
        ("decide + receipt, in process", in_process),
    ]
    if not args.no_orm:

        def through_orm(i: int) -> None:
            with orm_statements():
                in_process(i)

        rows.append(("  the same, ORM (bench switch)", through_orm))

    daphne = None
    client = None
    loop = None
    if not args.no_http:
        import httpx

        port = free_port()
        socket_path = Path(settings.DATA_DIR) / "sockets" / f"bench-{port}.sock"
        socket_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, YIMI_LOG_LEVEL="WARNING")
        daphne = subprocess.Popen(
            [str(Path(sys.executable).parent / "daphne"), "-b", "127.0.0.1", "-p", str(port), "-u", str(socket_path),
             "yimi_project.asgi:application"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        # The gateway's HTTP interface is on the internal listener (daphne's Unix socket).
        base = f"http://{settings.INTERNAL_HOST}/internal/gateway"
        headers = {"X-Yimi-Internal-Token": settings.INTERNAL_TOKEN}
        client = httpx.Client(headers=headers, timeout=10, transport=httpx.HTTPTransport(uds=str(socket_path)))
        deadline = time.monotonic() + 30
        while True:
            try:
                client.get(f"http://{settings.INTERNAL_HOST}/api/health/")
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise SystemExit("daphne did not start") from None
                time.sleep(0.2)

        def over_http(i: int) -> None:
            decided = client.post(f"{base}/decide/", json={"run_id": run_id, "tool": "demo__read", "arguments": {"key": f"h{i}"}}).json()
            assert decided["decision"] == "allow", decided
            stored = client.post(
                f"{base}/receipt/",
                json={"call_id": decided["call_id"], "capability": decided["receipt_capability"], "result": result},
            )
            assert stored.status_code == 200, stored.text

        rows.append(("decide + receipt, HTTP (daphne)", over_http))

        # The same through the platform's own client (what a sub-agent uses with
        # YIMI_GATEWAY_OVER_HTTP): the loop's keep-alive client, on an event loop.
        import asyncio

        from capabilities.client import HttpTransport

        platform_client = HttpTransport(str(socket_path))
        loop = asyncio.new_event_loop()

        def over_platform_client(i: int) -> None:
            decided = loop.run_until_complete(
                platform_client.decide({"run_id": run_id, "tool": "demo__read", "arguments": {"key": f"c{i}"}})
            )
            assert decided["decision"] == "allow", decided
            loop.run_until_complete(
                platform_client.receipt({"call_id": decided["call_id"], "capability": decided["receipt_capability"], "result": result})
            )

        rows.append(("  the same, platform client", over_platform_client))

    try:
        load_before = Path("/proc/loadavg").read_text().split()[0]
        figures = measure([fn for _, fn in rows], args.calls)
        load_after = Path("/proc/loadavg").read_text().split()[0]
    finally:
        if client is not None:
            client.close()
        if loop is not None:
            loop.close()
        if daphne is not None:
            daphne.terminate()
            daphne.wait(10)

    with CaptureQueriesContext(connection) as queries:
        in_process(-10_000_000)

    floor = figures[2]
    print(f"gateway: decide + receipt (observe tool), {args.calls} calls per row, interleaved in blocks of {BLOCK}, "
          f"PostgreSQL ({args.database_url.rsplit('/', 1)[-1]})")
    print(f"{'path':<34}{'p50 ms':>9}{'p99 ms':>9}{'calls/s':>10}{'CPU ms':>9}{'p50 / min':>11}{'p99 / min':>11}{'CPU / min':>11}")
    for (name, _), (p50, p99, rate, cpu) in zip(rows, figures, strict=True):
        print(f"{name:<34}{p50:>9.2f}{p99:>9.2f}{rate:>10.0f}{cpu:>9.2f}{ratio(p50 / floor[0]):>11}{ratio(p99 / floor[1]):>11}"
              f"{ratio(cpu / floor[3]):>11}")
    print("CPU ms: this process's CPU per call (the HTTP row's server side is daphne's, not counted)")
    print(f"queries per in-process decide + receipt: {len(queries.captured_queries)} (minimum SQL: 4)")
    print(f"load average (1 min) before/after the measurement: {load_before}/{load_after}")
    if args.show_queries:
        for q in queries.captured_queries:
            print(f"  {q['time']:>6}s  {q['sql'][:160]}")
    if args.profile:
        profile(in_process, args.profile)


def sql_floor(connection, run_id: str, owner_id: int) -> dict[str, Callable[[int], None]]:  # type: ignore[no-untyped-def]
    """Raw SQL on the gateway's connection: the floor decide + receipt cannot go below."""
    import json

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_floor (id bigserial PRIMARY KEY, v text NOT NULL)")
    arguments = json.dumps({"key": "x"})
    receipt = json.dumps({"receipt_schema": 1, "status": "succeeded", "values": [{"name": "answer", "value": 42, "unit": "unit", "source": "bench"}]})

    def select(i: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()

    def insert(i: int) -> None:
        with connection.cursor() as cursor:  # autocommit: the INSERT is its own transaction
            cursor.execute("INSERT INTO bench_floor (v) VALUES (%s)", [f"v{i}"])

    def minimum(i: int) -> None:
        call_id = uuid.uuid4()
        fingerprint = f"{i:064d}"[-64:]
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT owner_id, admission_id, scope, state, origin FROM brain_run WHERE id = %s LIMIT 1", [uuid.UUID(run_id)]
            )
            cursor.fetchone()
            cursor.execute(
                "INSERT INTO capabilities_toolcall (id, owner_id, run_id, agent_id, tool, category, arguments, owner_requested,"
                " fingerprint, idempotency_key, decision, decision_code, decision_reason, created_at, observed_error, pack_version)"
                " VALUES (%s, %s, %s, '', 'demo__read', 'observe', %s::jsonb, false, %s, %s, 'allow', 'ok', 'allowed', now(), '', '')",
                [call_id, owner_id, uuid.UUID(run_id), arguments, fingerprint, fingerprint[:32]],
            )
            cursor.execute(
                "SELECT id, owner_id, decision, tool, category, fingerprint, arguments FROM capabilities_toolcall WHERE id = %s LIMIT 1",
                [call_id],
            )
            cursor.fetchone()
            cursor.execute(
                "INSERT INTO capabilities_receiptrecord (owner_id, call_id, task_id, revision, call_fingerprint, status, receipt,"
                " content_fingerprint, violations, contradictions, written_by_gateway, created_at)"
                " VALUES (%s, %s, %s, 1, %s, 'succeeded', %s::jsonb, %s, '[]'::jsonb, '[]'::jsonb, false, now()) RETURNING id",
                [owner_id, call_id, str(call_id), fingerprint, receipt, fingerprint],
            )
            cursor.fetchone()

    return {"select": select, "insert": insert, "minimum": minimum}


@contextlib.contextmanager
def orm_statements() -> Iterator[None]:
    """``statements.insert`` and ``statements.fetch_by_pk`` replaced by the ORM calls they
    stand for, until the block ends (the ORM row)."""
    from yimi_project.infra import statements

    def insert(obj: Any) -> None:
        obj.save(force_insert=True)

    def fetch_by_pk(model: Any, pk: Any, field_names: tuple[str, ...]) -> Any:
        try:
            return model._default_manager.only(*field_names).get(pk=pk)
        except model.DoesNotExist:
            return None

    saved = statements.insert, statements.fetch_by_pk
    statements.insert, statements.fetch_by_pk = insert, fetch_by_pk  # type: ignore[assignment]
    try:
        yield
    finally:
        statements.insert, statements.fetch_by_pk = saved  # type: ignore[assignment]


def measure(fns: list[Callable[[int], None]], calls: int) -> list[tuple[float, float, float, float]]:
    """p50, p99 (ms), calls/s and this process's CPU ms per call of each function, run
    interleaved in blocks of ``BLOCK``."""
    for fn in fns:
        for i in range(min(200, max(1, calls // 10))):  # warm-up: connections, caches, prepared statements
            fn(-1 - i)
    samples: list[list[float]] = [[] for _ in fns]
    spent = [0.0 for _ in fns]
    cpu = [0.0 for _ in fns]
    for start in range(0, calls, BLOCK):
        for k, fn in enumerate(fns):
            c0 = time.process_time()
            for i in range(start, min(calls, start + BLOCK)):
                t0 = time.perf_counter()
                fn(i)
                elapsed = time.perf_counter() - t0
                samples[k].append(elapsed * 1000)
                spent[k] += elapsed
            cpu[k] += time.process_time() - c0
    return [
        (statistics.median(s), percentile(s, 0.99), len(s) / spent[k], cpu[k] * 1000 / len(s)) for k, s in enumerate(samples)
    ]


def ratio(value: float) -> str:
    return f"x{value:.1f}" if value >= 1 else f"x{value:.3f}"


def profile(fn: Callable[[int], None], calls: int) -> None:
    try:
        from pyinstrument import Profiler
    except ImportError:
        import cProfile
        import pstats

        prof = cProfile.Profile(time.process_time)  # CPU time: waiting on PostgreSQL is not the question
        prof.enable()
        for i in range(calls):
            fn(20_000_000 + i)
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(os.environ.get("BENCH_PROFILE_FILTER", ""), 60)
        return
    profiler = Profiler(interval=0.0002)
    profiler.start()
    for i in range(calls):
        fn(20_000_000 + i)
    profiler.stop()
    print(profiler.output_text(unicode=False, color=False, show_all=False))


if __name__ == "__main__":
    main()
