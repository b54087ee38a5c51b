"""Reminders, schedules and watches moved from the ``brain`` app to ``schedules``: an
installed instance upgrades in place. Its rows stay in the same tables (``brain_reminder``,
``brain_schedule``, ``brain_watch``, ``brain_watchnotice``) and are read through the new
models; their content types move to the new app label with their ids, so staff permissions
and admin log entries stay attached; and going back down the migrations moves them back."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import time, timedelta
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from brain.services import create_scheduled_run
from memory.timeline.entries import append_entry
from schedules.models import Reminder, Schedule, Watch, WatchNotice
from tests.support.migrations import BEFORE_RESTRUCTURE

pytestmark = pytest.mark.django_db(transaction=True)

MOVED = ("reminder", "schedule", "watch", "watchnotice")


def before_the_move(executor: MigrationExecutor) -> list[tuple[str, str | None]]:
    """The leaves an instance had before the restructure: brain still holds the models and
    the schedules app has no migration yet."""
    return BEFORE_RESTRUCTURE


@pytest.fixture
def executor() -> Iterator[MigrationExecutor]:
    made = MigrationExecutor(connection)
    yield made
    # Whatever happened, the database is at the leaves again for the tests after this one.
    made = MigrationExecutor(connection)
    made.migrate(made.loader.graph.leaf_nodes())
    ContentType.objects.clear_cache()


def test_rows_and_content_types_survive_the_move_to_the_schedules_app(executor: MigrationExecutor, owner: Any, make_device: Any) -> None:
    old = before_the_move(executor)
    executor.migrate(old)
    ContentType.objects.clear_cache()
    state = MigrationExecutor(connection).loader.project_state([node for node in old if node[1] is not None]).apps
    # an installed instance: the content types under brain only, a permission and an admin log entry on them
    OldContentType = state.get_model("contenttypes", "ContentType")
    OldContentType.objects.filter(app_label="schedules").delete()
    brain_types = {model: OldContentType.objects.get_or_create(app_label="brain", model=model)[0].pk for model in MOVED}
    permission = Permission.objects.get_or_create(content_type_id=brain_types["reminder"], codename="view_reminder", defaults={"name": "Can view reminder"})[0]
    log = LogEntry.objects.create(user=owner, content_type_id=brain_types["watch"], object_id="x", object_repr="a watch", action_flag=1)

    # rows written by the models as they were in brain
    device = make_device().device
    entry = append_entry(owner_id=owner.pk, kind="notice", text="⏰ 提醒：old", notice_code="reminder")
    run = create_scheduled_run(device, "check the parcel", executor="watch")
    now = timezone.now()
    state.get_model("brain", "Reminder").objects.create(
        owner_id=owner.pk, text="old", due_at=now, state="fired", idempotency_key="k1", fired_at=now, fired_entry_id=entry.pk
    )
    state.get_model("brain", "Schedule").objects.create(owner_id=owner.pk, device_id=device.pk, prompt="morning news", daily_at=time(8), next_run_at=now + timedelta(hours=1), last_run_id=run.pk)
    old_watch = state.get_model("brain", "Watch").objects.create(
        owner_id=owner.pk, device_id=device.pk, label="快递 YT1", tool="delivery__track", arguments={"tracking_number": "YT1"},
        s_from="not_delivered", s_to="delivered", next_run_at=now, once=True, last_run_id=run.pk,
    )
    state.get_model("brain", "WatchNotice").objects.create(watch_id=old_watch.pk, owner_id=owner.pk, entry_id=entry.pk, sends=2)

    MigrationExecutor(connection).migrate(executor.loader.graph.leaf_nodes())
    ContentType.objects.clear_cache()

    reminder = Reminder.objects.get()
    assert (reminder.text, reminder.state, reminder.idempotency_key, reminder.fired_entry_id) == ("old", Reminder.State.FIRED, "k1", entry.pk)
    schedule = Schedule.objects.get()
    assert (schedule.prompt, schedule.daily_at, schedule.device_id, schedule.last_run_id) == ("morning news", time(8), device.pk, run.pk)
    watch = Watch.objects.get()
    assert (watch.label, watch.arguments, watch.once, watch.last_run_id) == ("快递 YT1", {"tracking_number": "YT1"}, True, run.pk)
    notice = watch.notices.get()
    assert (notice.id, notice.entry_id, notice.sends, notice.state) == (WatchNotice.objects.get().id, entry.pk, 2, WatchNotice.State.PENDING)
    # the content types moved with their ids: the permission and the log entry follow them
    assert {ct.model: ct.pk for ct in ContentType.objects.filter(app_label="schedules")} == brain_types
    assert not ContentType.objects.filter(app_label="brain", model__in=MOVED).exists()
    assert ContentType.objects.get_for_model(Reminder).pk == brain_types["reminder"]
    assert Permission.objects.get(pk=permission.pk).content_type.app_label == "schedules"
    assert LogEntry.objects.get(pk=log.pk).content_type.model_class() is Watch


def test_going_back_down_the_migrations_moves_the_content_types_back(executor: MigrationExecutor) -> None:
    ids = {model: ContentType.objects.get(app_label="schedules", model=model).pk for model in MOVED}
    executor.migrate(before_the_move(executor))
    ContentType.objects.clear_cache()
    assert {ct.model: ct.pk for ct in ContentType.objects.filter(app_label="brain", model__in=MOVED)} == ids
    assert not ContentType.objects.filter(app_label="schedules").exists()
