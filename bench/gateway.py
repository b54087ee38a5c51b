"""Gateway benchmark: decide + receipt per call, in process and over loopback HTTP.

    .venv/bin/python bench/gateway.py [--calls 10000] [--database-url postgres://...]

Uses a fresh PostgreSQL database (``yimi_bench_gateway`` by default, dropped and created),
one owner, one device, one run, and the test pack ``demo``. Each call is a ``decide`` for
an observe tool with distinct arguments followed by a ``receipt`` for it, so every call
writes a ToolCall and a ReceiptRecord. In process it calls the services directly; over
HTTP it posts to daphne's loopback endpoints with one keep-alive client. The product
allows 3 s per decide; the targets are p99 < 5 ms in process and < 20 ms over loopback.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import free_port, percentile, recreate_database  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/yimi_bench_gateway")
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

    from tests.conftest import new_keypair, pairing_payload
    from tests.gateway_support import write_pack

    write_pack(packs_dir, "demo")
    call_command("migrate", verbosity=0)

    from accounts.services import ensure_owner
    from brain.services import accept_utterance
    from capabilities.services import CallRequest, decide, record_receipt
    from devices.services import PairingRequest, issue_pairing_code, pair_device

    owner = ensure_owner("owner", "benchmark-password").user  # type: ignore[union-attr]
    _, code = issue_pairing_code(owner)
    body, _ = pairing_payload(code)
    device = pair_device(PairingRequest.from_payload(body), client_ip="127.0.0.1")
    run_id = str(accept_utterance(device, "bench", "benchmark").run_id)
    result = {"receipt_schema": 1, "status": "succeeded", "values": [{"name": "answer", "value": 42, "unit": "unit", "source": "bench"}]}
    del new_keypair

    def in_process(i: int) -> None:
        decision = decide(CallRequest(run_id, "demo__read", {"key": f"p{i}"}))
        assert decision.decision == "allow", decision
        record_receipt(decision.call_id, result)

    rows = []
    rows.append(("in process", *measure(in_process, args.calls)))

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
    try:
        # The gateway's HTTP interface is on the internal listener (daphne's Unix socket).
        base = f"http://{settings.INTERNAL_HOST}/internal/gateway"
        headers = {"X-Yimi-Internal-Token": settings.INTERNAL_TOKEN}
        with httpx.Client(headers=headers, timeout=10, transport=httpx.HTTPTransport(uds=str(socket_path))) as client:
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

            rows.append(("HTTP, Unix socket (daphne)", *measure(over_http, args.calls)))
    finally:
        daphne.terminate()
        daphne.wait(10)

    print(f"gateway: decide + receipt, {args.calls} calls each, PostgreSQL ({args.database_url.rsplit('/', 1)[-1]})")
    print(f"{'path':<24}{'p50 ms':>9}{'p99 ms':>9}{'calls/s':>10}")
    for name, p50, p99, rate in rows:
        print(f"{name:<24}{p50:>9.2f}{p99:>9.2f}{rate:>10.0f}")


def measure(fn, calls: int) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    for i in range(min(200, calls // 10)):  # warm-up: connections, caches
        fn(-1 - i)
    samples = []
    started = time.perf_counter()
    for i in range(calls):
        t0 = time.perf_counter()
        fn(i)
        samples.append((time.perf_counter() - t0) * 1000)
    wall = time.perf_counter() - started
    return statistics.median(samples), percentile(samples, 0.99), calls / wall


if __name__ == "__main__":
    main()
