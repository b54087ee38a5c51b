"""Memory benchmark on PostgreSQL: L3 commits, forgetting, recall.

    .venv/bin/python bench/memory.py [--database-url postgres://...] [--entries 100000]

Uses a fresh database (``yimi_bench_memory`` by default, dropped and created) and one owner.

1. Commits per second through ``memory.assertions.store.commit`` (advisory lock, compare-and-set,
   receipt, re-evaluation walk) with 1 and with 8 concurrent writers (threads, one
   connection each) on the same owner, each writer versioning its own assertion.
2. Forgetting in a dependency graph of 10,000 assertions (each concluded from 1-2 earlier
   ones, every tenth with a second version), built through the commit service: the
   recursive walk alone (the preview) and the whole forget of the root, which reaches all.
3. Recall over 100,000 timeline entries (inserted in bulk for the setup): keyword search
   (pg_trgm-indexed ILIKE), the whole ``recall`` for a timeline question, and vector search
   with the test embedder.
4. Two-character Chinese queries over the same entries: the query they ran before the
   CJK bigram index (every row of the owner scored) and ``keyword_search`` now (the bigram
   ``tsvector`` index of migration 0005, newest first for one term), rare and common terms apart, beside the floor (``SELECT 1``) measured
   in the same run; the plan node PostgreSQL chose; the bigram column's cost per entry.

Prints one table. Benchmarks are never assertions in the test suite.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import percentile, recreate_database  # noqa: E402

WORDS_ZH = ["咖啡", "香菜", "开会", "妈妈", "电话", "周末", "杭州", "外卖", "牛奶", "跑步", "电影", "机票", "医生", "猫粮", "快递", "雨伞"]
WORDS_EN = ["coffee", "meeting", "train", "dinner", "invoice", "garden", "bakery", "flight", "doctor", "parcel"]
QUERIES = ["刚才那家店叫什么", "我昨天说要买什么牛奶", "周末和妈妈打电话", "when is the flight", "山茶咖啡的招牌", "医生说了什么"]
# Two-character Chinese queries (one term each): rare ones (the rare entry's words, about 10
# hits in 100,000, or none) and common ones (one of WORDS_ZH: about a quarter of the rows).
TWO_CHAR_RARE = ["山茶", "招牌", "绿色", "路过", "火锅", "高铁"]
TWO_CHAR_COMMON = ["咖啡", "杭州", "牛奶", "雨伞"]




def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/yimi_bench_memory")
    parser.add_argument("--commits", type=int, default=2000, help="commits per run (split among the writers)")
    parser.add_argument("--graph", type=int, default=10_000)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=60)
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="yimi-bench-memory-"))
    recreate_database(args.database_url)
    os.environ.update(DJANGO_SETTINGS_MODULE="yimi_project.settings", DATABASE_URL=args.database_url, YIMI_DATA_DIR=str(data_dir),
                      YIMI_LOG_LEVEL="WARNING")
    os.environ.pop("REDIS_URL", None)

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    call_command("migrate", verbosity=0)
    from accounts.services import ensure_owner
    from memory import recall
    from memory.assertions import store as assertions
    from memory.assertions.store import CommitRequest, Dependency
    from memory.models import TimelineCounter, TimelineEntry
    from memory.timeline.embeddings import HashingEmbedder, index_timeline, nearest

    owner = ensure_owner("owner", "benchmark-password").user  # type: ignore[union-attr]
    rows: list[tuple[str, str, str]] = []

    # 1. commits per second -------------------------------------------------------------------
    def writers(count: int, per_writer: int) -> tuple[float, list[float]]:
        ids = [assertions.commit(CommitRequest(owner_id=owner.pk, request_id=uuid.uuid4().hex, predicate="bench.writer",
                                               payload={"text": "v1"}, expected_version=0)).assertion_id for _ in range(count)]
        barrier, latencies, lock = threading.Barrier(count), [], threading.Lock()

        def work(aid: str) -> None:
            mine = []
            try:
                barrier.wait()
                for version in range(1, per_writer + 1):
                    t0 = time.perf_counter()
                    assertions.commit(CommitRequest(owner_id=owner.pk, request_id=uuid.uuid4().hex, predicate="bench.writer",
                                                    payload={"text": f"v{version + 1}"}, expected_version=version,
                                                    assertion_id=uuid.UUID(aid)))
                    mine.append((time.perf_counter() - t0) * 1000)
            finally:
                connection.close()
            with lock:
                latencies.extend(mine)

        threads = [threading.Thread(target=work, args=(aid,)) for aid in ids]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return count * per_writer / (time.perf_counter() - started), latencies

    for count in (1, 8):
        rate, lat = writers(count, args.commits // count)
        rows.append((f"commit, {count} writer{'s' if count > 1 else ''} on one owner",
                     f"{rate:,.0f} commits/s", f"p50 {statistics.median(lat):.2f} ms, p99 {percentile(lat, 0.99):.2f} ms"))

    # 2. forgetting in a 10,000-assertion graph ---------------------------------------------------
    rng = random.Random(7)
    ids: list[str] = []
    started = time.perf_counter()
    for i in range(args.graph):
        deps = tuple(Dependency(uuid.UUID(a), 1) for a in {ids[rng.randrange(len(ids))] for _ in range(rng.choice((1, 2)))}) if ids else ()
        result = assertions.commit(CommitRequest(owner_id=owner.pk, request_id=f"g{i}", predicate="bench.graph",
                                                 payload={"text": f"node {i}"}, expected_version=0, depends_on=deps))
        ids.append(result.assertion_id)
        if i % 10 == 5:
            assertions.commit(CommitRequest(owner_id=owner.pk, request_id=f"g{i}b", predicate="bench.graph",
                                            payload={"text": f"node {i} v2"}, expected_version=1, assertion_id=uuid.UUID(result.assertion_id),
                                            depends_on=deps))
    build = time.perf_counter() - started
    t0 = time.perf_counter()
    preview = assertions.forget_preview(owner.pk, ids[0])
    walk_ms = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    forgotten = assertions.forget(owner.pk, ids[0], request_id="bench-forget")
    forget_ms = (time.perf_counter() - t0) * 1000
    rows.append((f"build graph of {args.graph:,} (commit service)", f"{build:.1f} s", f"{args.graph / build:,.0f} commits/s with dependencies"))
    rows.append(("forget preview (recursive CTE)", f"{walk_ms:,.0f} ms", f"{len(preview.affected):,} assertions reached"))
    rows.append(("forget root of the graph", f"{forget_ms:,.0f} ms",
                 f"{len(forgotten.forgotten):,} assertions, {forgotten.versions_erased:,} versions erased"))

    # 3. recall over 100,000 timeline entries ---------------------------------------------------
    started = time.perf_counter()
    batch = []
    for seq in range(1, args.entries + 1):
        words = [rng.choice(WORDS_ZH) for _ in range(rng.randint(2, 6))] + [rng.choice(WORDS_EN) for _ in range(rng.randint(0, 2))]
        text = "，".join(words[:3]) + " " + " ".join(words[3:])
        if seq % 9973 == 0:
            text = "刚才路过的那家店叫山茶咖啡，招牌是绿色的"
        batch.append(TimelineEntry(owner=owner, seq=seq, kind="utterance" if seq % 2 else "reply", text=text, scope="owner"))
        if len(batch) == 5000:
            TimelineEntry.objects.bulk_create(batch)
            batch = []
    TimelineEntry.objects.bulk_create(batch)
    TimelineCounter.objects.update_or_create(owner=owner, defaults={"last_seq": args.entries})
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE memory_timelineentry")
    rows.append((f"insert {args.entries:,} timeline entries (bulk)", f"{time.perf_counter() - started:.1f} s", ""))

    def timed(fn, n: int) -> list[float]:  # type: ignore[no-untyped-def]
        out = []
        for i in range(n):
            t0 = time.perf_counter()
            fn(QUERIES[i % len(QUERIES)])
            out.append((time.perf_counter() - t0) * 1000)
        return out

    timed(lambda q: recall.keyword_search(owner.pk, q), 6)  # warm-up
    lat = timed(lambda q: recall.keyword_search(owner.pk, q), args.queries)
    rows.append((f"keyword search ({recall.keyword_backend()})", f"p50 {statistics.median(lat):.1f} ms", f"p99 {percentile(lat, 0.99):.1f} ms"))
    lat = timed(lambda q: recall.recall(owner.pk, q, layers=["l3", "timeline"], embedder=None), args.queries)
    rows.append(("recall l3 + timeline, keyword only", f"p50 {statistics.median(lat):.1f} ms", f"p99 {percentile(lat, 0.99):.1f} ms"))

    # 4. two-character Chinese queries: scan (before) and bigram index (after), beside the floor
    def timed_queries(fn, queries: list[str], n: int) -> list[float]:  # type: ignore[no-untyped-def]
        for q in queries:
            fn(q)  # warm-up
        out = []
        for i in range(n):
            t0 = time.perf_counter()
            fn(queries[i % len(queries)])
            out.append((time.perf_counter() - t0) * 1000)
        return out

    def select_one(_: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()

    floor = timed_queries(select_one, ["-"], args.queries)
    floor_p50 = statistics.median(floor)
    rows.append(("floor: SELECT 1 (same connection)", f"p50 {floor_p50:.2f} ms", f"p99 {percentile(floor, 0.99):.2f} ms"))
    def keyword_search_before(term: str) -> list[int]:
        """The SQL keyword_search ran for a one-term 2-character Chinese query before the
        bigram index (git 6e96b6a): every row of the owner scored with strpos, then sorted."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id FROM (SELECT id, seq, ((CASE WHEN strpos(text, %s) > 0 THEN 1.0 ELSE 0 END)) AS score "
                "FROM memory_timelineentry WHERE owner_id = %s) AS scored WHERE score > 0 ORDER BY score DESC, seq DESC LIMIT %s",
                [term, owner.pk, recall.LIST_MAX],
            )
            return [row[0] for row in cursor.fetchall()]

    for label, queries in (("rare", TWO_CHAR_RARE), ("common", TWO_CHAR_COMMON)):
        hits = sum(len(recall.keyword_search(owner.pk, q, limit=args.entries)) for q in queries) / len(queries)
        for q in queries:  # the same answer, before and after
            assert recall.query_terms(q) == [(q, 1.0)] and keyword_search_before(q) == recall.keyword_search(owner.pk, q), q
        before = timed_queries(keyword_search_before, queries, args.queries)
        after = timed_queries(lambda q: recall.keyword_search(owner.pk, q), queries, args.queries)
        b50, a50 = statistics.median(before), statistics.median(after)
        rows.append((f"2-char Chinese, {label} ({hits:,.0f} hits avg), scan (before)", f"p50 {b50:.1f} ms",
                     f"p99 {percentile(before, 0.99):.1f} ms; {b50 / floor_p50:,.0f}× floor"))
        rows.append((f"2-char Chinese, {label}, bigram index (after)", f"p50 {a50:.2f} ms",
                     f"p99 {percentile(after, 0.99):.2f} ms; {a50 / floor_p50:,.1f}× floor; {b50 / a50:,.1f}× faster than the scan"))
    with CaptureQueriesContext(connection) as captured:
        recall.keyword_search(owner.pk, TWO_CHAR_RARE[0])
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + captured.captured_queries[-1]["sql"])
        plan = [row[0] for row in cursor.fetchall()]
        cursor.execute("SELECT sum(length(yimi_cjk_bigrams(text)::text)) FROM memory_timelineentry")  # warm
        t0 = time.perf_counter()
        cursor.execute("SELECT count(yimi_cjk_bigrams(text)) FROM memory_timelineentry")
        per_entry_us = (time.perf_counter() - t0) * 1e6 / args.entries
    node = next((line.strip() for line in plan if "text_cjk_bigrams" in line and "Index" in line), plan[0].strip())
    rows.append(("plan for a 2-char query", node.split("  (")[0], ""))
    rows.append(("bigram column, computed per entry at insert", f"{per_entry_us:.1f} µs", "yimi_cjk_bigrams(text) over every entry"))

    embedder = HashingEmbedder()
    started = time.perf_counter()
    indexed = index_timeline(owner.pk, embedder, limit=args.entries, batch=1000)
    rows.append((f"embed + store {indexed:,} entries ({embedder.name})", f"{time.perf_counter() - started:.1f} s", ""))
    lat = timed(lambda q: nearest(owner.pk, embedder, q), max(10, args.queries // 4))
    rows.append(("vector search, exact cosine", f"p50 {statistics.median(lat):.1f} ms", f"p99 {percentile(lat, 0.99):.1f} ms"))
    lat = timed(lambda q: recall.recall(owner.pk, q, layers=["l3", "timeline"], embedder=embedder), max(10, args.queries // 4))
    rows.append(("recall l3 + timeline, keyword + vector (RRF)", f"p50 {statistics.median(lat):.1f} ms", f"p99 {percentile(lat, 0.99):.1f} ms"))

    print(f"memory benchmark, PostgreSQL ({args.database_url.rsplit('/', 1)[-1]}), {os.cpu_count()} CPUs")
    width = max(len(r[0]) for r in rows) + 2
    print(f"{'measure':<{width}}{'result':>20}  detail")
    for name, result, detail in rows:
        print(f"{name:<{width}}{result:>20}  {detail}")


if __name__ == "__main__":
    main()
