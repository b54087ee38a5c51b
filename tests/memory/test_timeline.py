from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from memory.models import TimelineCounter, TimelineEntry
from memory.timeline.entries import append_entry, page_after

pytestmark = pytest.mark.django_db(transaction=True)

PER_DEVICE = 40


def test_two_devices_appending_at_once_get_distinct_gapless_numbers(make_device: Any) -> None:
    """Two threads, two real database connections, writing at the same time."""
    devices = [make_device("phone").device, make_device("mac").device]
    start = threading.Barrier(len(devices))
    errors: list[BaseException] = []

    def writer(device: Any) -> None:
        try:
            start.wait()
            for i in range(PER_DEVICE):
                append_entry(owner_id=device.owner_id, kind="utterance", text=f"{device.kind} {i}", device_id=device.id, scope="owner")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, args=(d,)) for d in devices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    seqs = list(TimelineEntry.objects.order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, 2 * PER_DEVICE + 1))
    # each device's own entries keep their order
    for device in devices:
        texts = list(TimelineEntry.objects.filter(device=device).order_by("seq").values_list("text", flat=True))
        assert texts == [f"{device.kind} {i}" for i in range(PER_DEVICE)]


def test_a_rolled_back_append_leaves_no_gap(owner: Any) -> None:
    from django.db import transaction

    append_entry(owner_id=owner.id, kind="notice", text="one")
    with pytest.raises(RuntimeError), transaction.atomic():
        append_entry(owner_id=owner.id, kind="notice", text="lost")
        raise RuntimeError("crash before commit")
    append_entry(owner_id=owner.id, kind="notice", text="two")
    assert list(TimelineEntry.objects.values_list("seq", "text")) == [(1, "one"), (2, "two")]


def backend_waits_on_a_lock(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return row is not None and row[0] == "Lock"


def test_second_writer_waits_for_the_first_writers_transaction(owner: Any) -> None:
    """The counter row lock serializes appends: a writer holding it blocks the next."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks are a PostgreSQL behaviour; SQLite serializes whole write transactions")
    from django.db import transaction

    append_entry(owner_id=owner.id, kind="notice", text="first")
    inside, release = threading.Event(), threading.Event()
    fast_backend: list[int] = []
    finished: list[str] = []

    def slow_writer() -> None:
        with transaction.atomic():
            append_entry(owner_id=owner.id, kind="notice", text="slow")
            inside.set()
            release.wait(60)  # until the test has seen the fast writer wait (60 s only bound a failure)
        finished.append("slow")
        connections.close_all()

    def fast_writer() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            fast_backend.append(cursor.fetchone()[0])
        inside.wait(60)
        append_entry(owner_id=owner.id, kind="notice", text="fast")
        finished.append("fast")
        connections.close_all()

    slow, fast = threading.Thread(target=slow_writer), threading.Thread(target=fast_writer)
    slow.start()
    fast.start()
    # Seen, not timed: the fast writer's backend waits on a lock while the slow one holds it.
    deadline = time.monotonic() + 60
    while not (fast_backend and backend_waits_on_a_lock(fast_backend[0])):
        assert time.monotonic() < deadline, "the second writer never waited on the first one's lock"
        time.sleep(0.02)
    assert finished == []
    release.set()
    slow.join()
    fast.join()
    assert list(TimelineEntry.objects.values_list("seq", "text")) == [(1, "first"), (2, "slow"), (3, "fast")]


def test_sequence_numbers_are_per_owner(owner: Any, django_user_model: Any) -> None:
    other = django_user_model.objects.create_user("someone-else")
    assert append_entry(owner_id=owner.id, kind="notice", text="a").seq == 1
    assert append_entry(owner_id=other.id, kind="notice", text="b").seq == 1
    assert append_entry(owner_id=owner.id, kind="notice", text="c").seq == 2


def test_an_append_is_one_statement_on_postgresql_and_the_entry_holds_its_row(owner: Any, make_device: Any) -> None:
    """The counter's upsert and the entry's INSERT go as one statement on PostgreSQL (SQLite
    takes the ORM: step 3; the counter's get_or_create, SELECT FOR UPDATE and UPDATE, then
    the INSERT); the returned entry has its key and number, as the row does, and the
    counter has moved on."""
    device = make_device("phone").device
    append_entry(owner_id=owner.id, kind="notice", text="before")
    with CaptureQueriesContext(connection) as queries:
        entry = append_entry(owner_id=owner.id, kind="utterance", text="hi", device_id=device.id, client_id="c1", scope="owner")
    written = [q["sql"] for q in queries if q["sql"].split()[0] not in ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE")]
    assert len(written) == (1 if connection.vendor == "postgresql" else 4), written
    stored = TimelineEntry.objects.get(pk=entry.pk)
    assert (stored.seq, stored.text, stored.device_id, stored.client_id, stored.created_at) == (
        2, "hi", device.id, "c1", entry.created_at
    ) and entry.seq == 2 and not entry._state.adding
    assert TimelineCounter.objects.get(owner_id=owner.id).last_seq == 2


def test_pages_walk_the_whole_timeline_in_order(owner: Any) -> None:
    for i in range(7):
        append_entry(owner_id=owner.id, kind="notice", text=str(i))
    seen, after = [], 0
    while True:
        page = page_after(owner_id=owner.id, after=after, limit=3)
        seen += [e.seq for e in page.entries]
        after = page.next_after
        if not page.has_more:
            break
    assert seen == list(range(1, 8))
    assert page_after(owner_id=owner.id, after=7, limit=3).entries == []
