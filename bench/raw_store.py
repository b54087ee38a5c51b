"""L5 hot store benchmark on PostgreSQL: durable archive writes and recall's L5 layer.

    .venv/bin/python bench/raw_store.py [--database-url postgres://...] [--batches 400] [--objects 20000]

Uses a fresh database (``yimi_bench_raw_store`` by default, dropped and created), one owner and
a temporary data directory on the machine's disk (the hot root lives there).

1. One archive batch (16,000 bytes: 500 ms of 16 kHz 16-bit mono PCM) through
   ``raw_store.store_batch``: disk admission (``statvfs``), temporary file, fsync, rename,
   fsync of the directory, the row. Beside it, in the same run, the floors: the same bytes
   written with write + fsync + rename + directory fsync alone, and one ``statvfs``. The
   real-time factor is 500 ms over the p50: how many streams one writer keeps up with.
2. Recall's L5 layer ("刚才那家店叫什么") over ``--objects`` archive batches (rows inserted in bulk,
   the last 15 min with their files): the whole ``recall`` with layers l5, which finds,
   joins and fetches the top segments from the hot store; beside it the index query alone.

Prints one table. Benchmarks are never assertions in the test suite.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import percentile, recreate_database  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/yimi_bench_raw_store")
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--objects", type=int, default=20_000)
    parser.add_argument("--queries", type=int, default=30)
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="yimi-bench-raw-", dir=os.environ.get("BENCH_DIR")))
    recreate_database(args.database_url)
    os.environ.update(DJANGO_SETTINGS_MODULE="yimi_project.settings", DATABASE_URL=args.database_url, YIMI_DATA_DIR=str(data_dir),
                      YIMI_LOG_LEVEL="WARNING")
    os.environ.pop("REDIS_URL", None)

    import django

    django.setup()
    from django.core.management import call_command
    from django.db.models import Q
    from django.utils import timezone

    call_command("migrate", verbosity=0)
    from accounts.services import ensure_owner
    from memory import recall
    from memory.archive import raw_store
    from memory.archive.models import RawObject

    owner = ensure_owner("owner", "benchmark-password").user  # type: ignore[union-attr]
    capture = raw_store.Capture(owner.pk, None, "phone_app", "bench phone")
    rows: list[tuple[str, str, str]] = []
    data = os.urandom(16_000)

    # 1. archive writes ---------------------------------------------------------------------------
    clock = [0.0]
    batcher = raw_store.ArchiveBatcher(clock=lambda: clock[0])
    store_ms: list[float] = []
    for _ in range(args.batches):
        batch = batcher.add(data)
        clock[0] += 0.5
        batch = batch or batcher.flush()
        assert batch is not None
        t0 = time.perf_counter()
        raw_store.store_batch(capture, batch, stream="bench")
        store_ms.append((time.perf_counter() - t0) * 1000)
    floor_dir = data_dir / "floor"
    floor_dir.mkdir()
    floor_ms: list[float] = []
    for i in range(args.batches):
        t0 = time.perf_counter()
        raw_store.write_durably(floor_dir / f"{i}.pcm", data)
        floor_ms.append((time.perf_counter() - t0) * 1000)
    statvfs_us: list[float] = []
    for _ in range(args.batches):
        t0 = time.perf_counter()
        os.statvfs(data_dir)
        statvfs_us.append((time.perf_counter() - t0) * 1e6)
    p50 = statistics.median(store_ms)
    rows.append(("store_batch (16,000 B = 500 ms audio)", f"p50 {p50:.2f} ms, p95 {percentile(store_ms, 0.95):.2f} ms",
                 f"{500 / p50:,.0f}x real time per writer"))
    rows.append(("floor: write + fsync + rename + dir fsync", f"p50 {statistics.median(floor_ms):.2f} ms, p95 {percentile(floor_ms, 0.95):.2f} ms", ""))
    rows.append(("floor: statvfs", f"p50 {statistics.median(statvfs_us):.1f} µs", ""))

    # 2. recall's L5 layer ----------------------------------------------------------------------------
    now = timezone.now()
    RawObject.objects.all().delete()
    digest = hashlib.sha256(data).hexdigest()
    recent = 15 * 60 * 2  # the last 15 min of batches have their files
    objects = []
    for i in range(args.objects):
        started = now - timedelta(seconds=0.5 * (args.objects - i))
        relative = f"{owner.pk}/audio/bench/{uuid.uuid4().hex}.pcm"
        if i >= args.objects - recent:
            path = raw_store.hot_root() / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        objects.append(RawObject(owner_id=owner.pk, device_id=None, channel="phone_app", kind="audio", codec=raw_store.PCM_CODEC,
                                 stream=f"s{i // 7200}", stream_offset=8000 * (i % 7200), started_at=started,
                                 ended_at=started + timedelta(seconds=0.5), size=len(data), sha256=digest, hot_path=relative))
    RawObject.objects.bulk_create(objects, batch_size=2000)
    index_ms, recall_ms = [], []
    fetched = 0
    for _ in range(args.queries):
        t0 = time.perf_counter()
        list(RawObject.objects.filter(Q(owner_id=owner.pk) & Q(erased_at__isnull=True), started_at__gte=now - timedelta(minutes=15))
             .order_by("-started_at")[:2000].values_list("id", flat=True))
        index_ms.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        result = recall.recall(owner.pk, "刚才那家店叫什么", layers=["l5"], embedder=None)
        recall_ms.append((time.perf_counter() - t0) * 1000)
        fetched = sum(o.get("fetched_bytes", 0) for o in result.originals)
    rows.append((f"recall l5 over {args.objects:,} batches (top 5 fetched, {fetched / 1e6:.1f} MB)",
                 f"p50 {statistics.median(recall_ms):.1f} ms, p95 {percentile(recall_ms, 0.95):.1f} ms", ""))
    rows.append(("floor: the index query alone (15 min, ≤2,000 ids)", f"p50 {statistics.median(index_ms):.2f} ms", ""))

    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'latency':<34}  note")
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:<34}  {note}")


if __name__ == "__main__":
    main()
