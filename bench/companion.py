"""Companion benchmark on PostgreSQL: call start to snapshot ready (issue 21).

    .venv/bin/python bench/companion.py [--database-url postgres://...] [--calls 300]

Uses a fresh database (``yimi_bench_companion`` by default, dropped and created) and one
owner with 1,000 end-of-call summaries, 200 topic rows (refused, answered, done, cooldown
and details, some corrected), 20 L3 facts cited by the summaries and 5 interests, plus a
second owner with the same amount (every query must stay on its own owner's rows).

Measured, each ``--calls`` times, in this order of what sits before the first audio:

1. ``topic_state.continuity_for``: the continuity the snapshot reads;
2. call start to snapshot ready: ``accounts.voice.start_call`` + ``call_snapshot.prepare``
   of a new call (persona, background, opening, card, the frozen row), as the voice
   socket's ``call.start`` runs them;
3. a retried start of the same call (the snapshot reused);
4. the floors, measured in the same run: ``SELECT 1`` on the same connection (the database
   round trip) and one trivial ORM query (Django's compile + the round trip). A call start
   runs 11 statements; its reads are SQL built once per process (``statements.fetch``), so
   they cost about the ``SELECT 1`` floor each, not the ORM one.

Goal (issue 21): call start to snapshot ready under 20 ms p99. Prints one table.
Benchmarks are never assertions in the test suite.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import percentile, recreate_database  # noqa: E402

SUMMARIES = 1000
TOPIC_ROWS = 200
FACTS = 20
LABELS = ["修车床", "老伴", "听戏", "做饭", "养花种菜", "喝茶", "儿女孙辈", "身体"]
KEYS = ["craft.lathe", "family.spouse", "music.opera", "food.cooking", "garden.plants", "drink.tea", "family.children", "health.body"]


def timed(fn: Callable[[int], object], rounds: int) -> list[float]:
    out = []
    for i in range(rounds):
        t0 = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/yimi_bench_companion")
    parser.add_argument("--calls", type=int, default=300, help="measurements per row")
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="yimi-bench-companion-"))
    recreate_database(args.database_url)
    os.environ.update(DJANGO_SETTINGS_MODULE="yimi_project.settings", DATABASE_URL=args.database_url, YIMI_DATA_DIR=str(data_dir),
                      YIMI_LOG_LEVEL="WARNING")
    os.environ.pop("REDIS_URL", None)

    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    print("migrating a fresh database …", file=sys.stderr)
    call_command("migrate", verbosity=0)
    from accounts import voice as identity
    from accounts.models import Device, VoiceCall
    from accounts.services import ensure_owner
    from companion import snapshot as call_snapshot
    from companion import topics as topic_state
    from companion.extractor import EXTRACTOR_VERSION
    from companion.models import CallSummary, TopicState
    from memory.assertions import store as assertions
    from memory.assertions.store import CommitRequest
    from memory.timeline.entries import append_entry

    owner = ensure_owner("owner", "benchmark-password").user  # type: ignore[union-attr]
    other = get_user_model().objects.create_user("other", password="benchmark-password")

    def fill(user: object) -> Device:
        uid = user.pk  # type: ignore[attr-defined]
        device = Device.objects.create(owner_id=uid, name="phone", kind="phone", capture_channels=["phone_app"],
                                       public_key=uuid.uuid4().hex)
        now = timezone.now()
        calls = VoiceCall.objects.bulk_create(
            [VoiceCall(owner_id=uid, device=device, call_id=f"past-{i}", channel="phone_app", ended_at=now) for i in range(SUMMARIES)]
        )
        entries = [append_entry(owner_id=uid, kind="utterance", text=f"我以前修车床，第{i}回", device_id=device.id, scope="owner")
                   for i in range(TOPIC_ROWS)]
        facts = []
        for i in range(FACTS):
            result = assertions.commit(CommitRequest(owner_id=uid, request_id=uuid.uuid4().hex, predicate="work.history",
                                                     payload={"text": f"在红星机床厂干了{i + 10}年"}, expected_version=0,
                                                     evidence=(entries[i].seq,)))
            facts.append(result.assertion_id)
        for i, interest in enumerate(["修车床", "听戏", "喝茶", "养花", "做饭"]):
            assertions.commit(CommitRequest(owner_id=uid, request_id=uuid.uuid4().hex, predicate=f"interest.i{i}",
                                            payload={"text": interest}, expected_version=0))
        summaries = CallSummary.objects.bulk_create([
            CallSummary(owner_id=uid, call=call, transcript_version=uuid.uuid4().hex, extractor_version=EXTRACTOR_VERSION, epoch=0,
                        text=f"聊了修车床（「我以前修车床，第{i}回」）。不想聊：老伴", source_entries=[entries[i % TOPIC_ROWS].id],
                        facts={facts[i % FACTS]: {"version": 1, "seqs": [entries[i % FACTS].seq]}},
                        stats={"short_reply_loops": i % 2}, created_at=now - timedelta(minutes=SUMMARIES - i))
            for i, call in enumerate(calls)
        ])
        states = ["answered", "refused", "done", "cooldown"]
        TopicState.objects.bulk_create([
            TopicState(owner_id=uid, summary=summaries[i * 5], topic_key=KEYS[i % len(KEYS)] if i % 10 else "work.factory",
                       label=LABELS[i % len(LABELS)] if i % 10 else "工厂名字", state=states[i % 4] if i % 10 else "answered",
                       change="answered", source_call=summaries[i * 5].call, source_entry=entries[i], quote=entries[i].text,
                       extractor_version=EXTRACTOR_VERSION, epoch=0, position=0, cooldown_until=now + timedelta(days=1),
                       created_at=now - timedelta(minutes=TOPIC_ROWS - i))
            for i in range(TOPIC_ROWS)
        ])
        return device

    print(f"filling two owners with {SUMMARIES:,} summaries and {TOPIC_ROWS} topic rows each …", file=sys.stderr)
    device = fill(owner)
    fill(other)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # what autovacuum would have done after the bulk inserts
    rows: list[tuple[str, str, str]] = []

    def row(name: str, lat: list[float], floor: float | None = None) -> None:
        p50, p99 = statistics.median(lat), percentile(lat, 0.99)
        detail = f"p99 {p99:.2f} ms" + (f"; p50 {p50 / floor:,.1f}× floor" if floor else "")
        rows.append((name, f"p50 {p50:.2f} ms", detail))

    def select_one(_: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()

    def start(i: int) -> None:
        call = identity.start_call(device, f"bench-{i}", "phone_app")
        call_snapshot.prepare(call)

    def restart(i: int) -> None:
        call = identity.start_call(device, f"bench-{i}", "phone_app")  # the same, still open: reused
        call_snapshot.prepare(call)

    from companion.models import CompanionSettings

    def orm_one(_: int) -> None:
        CompanionSettings.objects.filter(owner_id=owner.pk).values_list("continuity_enabled", flat=True).first()

    timed(select_one, 20)  # warm the connection
    floor = timed(select_one, args.calls)
    floor_p50 = statistics.median(floor)
    orm_floor = timed(orm_one, args.calls)
    continuity = timed(lambda _: topic_state.continuity_for(owner.pk), args.calls)
    started = timed(start, args.calls)
    retried = timed(restart, args.calls)
    snap = call_snapshot.CallSnapshot.objects.filter(call__call_id="bench-0").first()
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as during_start:
        start(args.calls)
    with CaptureQueriesContext(connection) as during_continuity:
        topic_state.continuity_for(owner.pk)

    rows.append(("floor: SELECT 1 (same connection)", f"p50 {floor_p50:.2f} ms", f"p99 {percentile(floor, 0.99):.2f} ms"))
    row("floor: one trivial ORM query (compile + round trip)", orm_floor, floor_p50)
    row("continuity_for (1,000 summaries, 200 topic rows)", continuity, floor_p50)
    row("call start -> snapshot ready (new call)", started, floor_p50)
    rows.append(("  queries: continuity_for / whole call start", f"{len(during_continuity.captured_queries)} / {len(during_start.captured_queries)}", ""))
    row("retried start of the same call (reused)", retried, floor_p50)
    p99 = percentile(started, 0.99)
    rows.append(("goal: call start -> snapshot ready p99 < 20 ms", "met" if p99 < 20 else "NOT met", f"p99 {p99:.2f} ms"))
    if snap is not None:
        bg = snap.background
        rows.append(("snapshot background (one of them)", f"{len(str(bg.get('latest_summary', ''))) + len(str(bg.get('resume_thread', '')))} chars",
                     f"opening {snap.opening_key}; avoid {bg.get('avoid_topics')}"))

    print(f"companion benchmark, PostgreSQL ({args.database_url.rsplit('/', 1)[-1]}), {os.cpu_count()} CPUs, {args.calls} calls per row")
    width = max(len(r[0]) for r in rows) + 2
    print(f"{'measure':<{width}}{'result':>18}  detail")
    for name, result, detail in rows:
        print(f"{name:<{width}}{result:>18}  {detail}")


if __name__ == "__main__":
    main()
