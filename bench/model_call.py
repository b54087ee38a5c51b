"""Model-call benchmark: CPU per streamed model call over h11 (``yimi_project.infra.http11``) vs httpx, beside a raw floor.

    .venv/bin/python bench/model_call.py [--calls 2000] [--lines 36]

The demo brain (``llm.fake_server``) runs in a subprocess, so its CPU is not counted, and
answers every request with a streamed reply of ``--lines`` SSE lines (content events, the
finish event, the usage event and ``[DONE]``, two lines each). Three rows, all on one kept
connection each, measured interleaved in blocks of 50 calls, so a busy machine slows them alike:

- ``h11``: ``llm.client._post``, the way every model call goes (``http11.post`` on this
  event loop's connection pool, the stream read by ``llm.client._read_stream``);
- ``httpx``: ``llm.client._post_via_proxy`` with the loop's kept ``httpx.AsyncClient``
  (``client.stream`` + ``aiter_lines``, read by the same ``_read_stream``): the way a
  proxied endpoint goes, and the way every call went before ``http11``;
- the floor: the same request bytes written and the same response bytes read on a raw
  asyncio stream (``asyncio.open_connection``), read until the chunked body's end, no parsing.

Each row: this process's CPU ms per call (``time.process_time``), p50 and p99 wall ms, and
the ratios to the floor. Run on demand; it is not part of the test suite
(docs/decisions/2026-12-03-model-calls-over-h11.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import free_port, percentile  # noqa: E402

BLOCK = 50
SERVER = """
import sys
from llm.fake_server import FakeBrainServer, Rule, Script
server = FakeBrainServer(port=int(sys.argv[1]), script=Script(rules=[Rule(reply=sys.argv[2], chunk_chars=8, delay_ms=0)]))
print("ready", flush=True)
server.serve_forever()
"""


def reply_for(lines: int) -> str:
    """A reply whose stream is ``lines`` SSE lines: (pieces + finish + usage + [DONE]) x 2."""
    pieces = max(1, lines // 2 - 3)
    return ("Here is a benchmark reply, one piece at a time. " * 10)[: pieces * 8]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per row")
    parser.add_argument("--lines", type=int, default=36, help="SSE lines per streamed reply")
    args = parser.parse_args()

    os.environ.update(DJANGO_SETTINGS_MODULE="yimi_project.settings", YIMI_DATA_DIR=tempfile.mkdtemp(prefix="yimi-bench-mc-"))
    for name in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(name, None)
    import django

    django.setup()
    from llm import client as llm_client
    from yimi_project.infra import http11

    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port), reply_for(args.lines)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
        figures, seen = asyncio.run(measure(llm_client, http11, port, args.calls))
    finally:
        server.terminate()
        server.wait(10)

    floor = figures["raw asyncio stream (floor)"]
    print(f"model call: one streamed POST of {seen} SSE lines to the demo brain (subprocess), {args.calls} calls per row, "
          f"interleaved in blocks of {BLOCK}; load average (1 min) before/after: {figures.pop('load')}")
    print(f"{'path':<34}{'CPU ms':>9}{'p50 ms':>9}{'p99 ms':>9}{'CPU / floor':>13}{'p50 / floor':>13}")
    for name, (cpu, p50, p99) in figures.items():
        print(f"{name:<34}{cpu:>9.3f}{p50:>9.3f}{p99:>9.3f}{cpu / floor[0]:>12.2f}x{p50 / floor[1]:>12.2f}x")


async def measure(llm_client, http11, port: int, calls: int) -> tuple[dict, int]:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    llm_client.keep_client_on(loop)  # as a worker's run loop: kept connections (h11's pool, httpx's client)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    body = {"model": "yimi-demo", "messages": [{"role": "user", "content": "benchmark"}], "stream": True,
            "stream_options": {"include_usage": True}}
    headers = {"Content-Type": "application/json"}
    timeouts = http11.Timeouts(connect=5, read=30)

    async def over_h11() -> None:
        completion = await llm_client._post(url, body, headers, timeouts, None)
        assert completion.text

    async def over_httpx() -> None:
        completion = await llm_client._post_via_proxy(url, body, headers, timeouts, None)
        assert completion.text

    content = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: yimi\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(content)}\r\n\r\n").encode() + content
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    seen = 0

    async def raw() -> None:
        nonlocal seen
        writer.write(request)
        data = await reader.readuntil(b"\r\n0\r\n\r\n")  # the chunked body's end
        seen = data.count(b"\n\n")  # events (each is two SSE lines)

    rows: dict[str, Callable[[], Awaitable[None]]] = {
        "raw asyncio stream (floor)": raw,
        "h11 (llm.client, as shipped)": over_h11,
        "httpx AsyncClient stream": over_httpx,
    }
    for fn in rows.values():  # warm-up: connections, imports
        for _ in range(50):
            await fn()
    samples: dict[str, list[float]] = {name: [] for name in rows}
    cpu = dict.fromkeys(rows, 0.0)
    load_before = Path("/proc/loadavg").read_text().split()[0]
    for _ in range(0, calls, BLOCK):
        for name, fn in rows.items():
            c0 = time.process_time()
            for _ in range(BLOCK):
                t0 = time.perf_counter()
                await fn()
                samples[name].append((time.perf_counter() - t0) * 1000)
            cpu[name] += time.process_time() - c0
    load_after = Path("/proc/loadavg").read_text().split()[0]
    writer.close()
    out: dict = {name: (cpu[name] * 1000 / len(s), statistics.median(s), percentile(s, 0.99)) for name, s in samples.items()}
    out["load"] = f"{load_before}/{load_after}"
    return out, seen * 2


if __name__ == "__main__":
    main()
