"""Runs overlap on one worker (brain.tasks.on_worker_loop): a real Celery worker as production
starts it (the thread pool, ``YIMI_WORKER_RUNS`` slots, every run on the process's one event
loop). While one run's brain request is held by the test, a second run is dispatched to the
same worker and completes; the held run then completes too, each claimed once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings as django_settings
from django.db import connection

from brain.dispatch import dispatch_run
from brain.models import Run
from brain.services import accept_utterance
from llm.fake_server import Rule, Script
from memory.models import TimelineEntry
from tests.conftest import need, new_client_id, use_brain
from tests.support.process_support import TASK_SECONDS, CeleryWorker, celery_worker, publishing_to, redis_prefix

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


class GatedScript(Script):
    """The fake brain's script; a request whose last user text contains ``hold me`` waits
    (in its own server thread) until the test opens ``gate``."""

    def __init__(self, rules: list[Rule]) -> None:
        super().__init__(rules=rules)
        self.gate = threading.Event()
        self.holding = threading.Event()

    def scripted_rule(self, body: dict[str, Any]) -> Rule | None:
        last = next((m for m in reversed(body.get("messages") or []) if m.get("role") == "user"), {})
        if "hold me" in str(last.get("content", "")):
            self.holding.set()
            self.gate.wait(TASK_SECONDS)
        return super().scripted_rule(body)


@pytest.fixture
def one_worker(transactional_db: Any, fake_brain: Any, settings: Any, tmp_path: Path) -> Iterator[CeleryWorker]:
    need(connection.vendor == "postgresql", "a Celery worker runs against PostgreSQL (set DATABASE_URL)")
    need(bool(django_settings.REDIS_URL), "a Celery worker needs Redis (set REDIS_URL)")
    use_brain(fake_brain.base_url)
    (tmp_path / "packs").mkdir()
    settings.YIMI_PACKS_DIR = tmp_path / "packs"
    saved = fake_brain.script
    with redis_prefix("overlap") as prefix, celery_worker(
        prefix, Path(django_settings.DATA_DIR) / f"{prefix}.log", concurrency=2,
        YIMI_PACKS_DIR=str(tmp_path / "packs"), YIMI_BRAIN_BASE_URL=fake_brain.base_url,
    ) as worker, publishing_to(prefix, settings):
        try:
            yield worker
            worker.wait_idle()
        finally:
            if isinstance(fake_brain.script, GatedScript):
                fake_brain.script.gate.set()  # a failed test leaves no request held
            fake_brain.script = saved


def wait_for(worker: CeleryWorker, what: str, condition: Any) -> Any:
    return worker.wait_until(what, condition, TASK_SECONDS)


def test_a_second_run_completes_on_the_same_worker_while_the_first_waits_for_the_brain(
    one_worker: CeleryWorker, fake_brain: Any, make_device: Any
) -> None:
    gated = GatedScript([Rule(match="hold me", reply="Released at last."), Rule(reply="Right away.")])
    fake_brain.script = gated
    sim = make_device("phone")
    held = accept_utterance(sim.device, new_client_id(), "hold me")
    async_to_sync(dispatch_run)(held.run_id)
    wait_for(one_worker, "the first run's brain request", gated.holding.is_set)

    quick = accept_utterance(sim.device, new_client_id(), "and now something quick")
    async_to_sync(dispatch_run)(quick.run_id)
    wait_for(one_worker, "the second run to end", lambda: Run.objects.filter(id=quick.run_id, state="succeeded").exists())
    assert Run.objects.get(id=held.run_id).state == "running"  # still waiting for its brain: the runs overlapped
    assert TimelineEntry.objects.get(reply_to_id=quick.entry.id, kind="reply").text == "Right away."

    gated.gate.set()
    wait_for(one_worker, "the first run to end", lambda: Run.objects.filter(id=held.run_id, state="succeeded").exists())
    assert TimelineEntry.objects.get(reply_to_id=held.entry.id, kind="reply").text == "Released at last."
    # Both came to the worker on the run lane (brain.run_lane), not as Celery tasks.
    assert one_worker.wait_for_lane_runs([held.run_id, quick.run_id]) == {str(held.run_id): "succeeded", str(quick.run_id): "succeeded"}
    assert not one_worker.tasks("brain.tasks.execute_run")
    assert [Run.objects.get(id=r).attempts for r in (held.run_id, quick.run_id)] == [1, 1]
    # One process ran both (a thread pool, no pool children), so they shared its one loop.
    tasks = Path(f"/proc/{one_worker.proc.pid}/task")
    assert [pid for thread in tasks.iterdir() for pid in (thread / "children").read_text().split()] == []
