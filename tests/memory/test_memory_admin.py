"""The owner's memory in the admin: history and dependencies, edits through the commit
service, forgetting with a preview, and what needs re-evaluation."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from memory.assertions import store as assertions
from memory.assertions.store import CommitRequest, Dependency
from memory.models import Assertion, AssertionVersion


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, settings: Any) -> None:
    settings.DATA_DIR = tmp_path


@pytest.fixture
def admin_client_for(owner: Any) -> Client:
    client = Client()
    client.force_login(owner)
    return client


def believe(owner: Any, text: str, *, predicate: str = "preference.food", deps: tuple[tuple[str, int], ...] = ()) -> str:
    return assertions.commit(
        CommitRequest(owner_id=owner.pk, request_id=uuid.uuid4().hex, predicate=predicate, payload={"text": text}, expected_version=0,
                      depends_on=tuple(Dependency(uuid.UUID(a), v) for a, v in deps), actor="agent")
    ).assertion_id


def test_the_admin_shows_an_assertion_with_its_full_history_and_dependencies(owner: Any, admin_client_for: Client) -> None:
    a = believe(owner, "不吃香菜")
    assertions.commit(CommitRequest(owner_id=owner.pk, request_id="v2", predicate="preference.food", payload={"text": "香菜能吃了"},
                                    expected_version=1, assertion_id=uuid.UUID(a)))
    b = believe(owner, "外卖备注不要香菜", predicate="habit.takeout_note", deps=((a, 1),))
    page = admin_client_for.get(f"/admin/memory/assertion/{a}/change/").content.decode()
    assert "不吃香菜" in page and "香菜能吃了" in page and "v1" in page and "v2" in page
    assert f"/admin/memory/assertion/{b}/change/" in page and "habit.takeout_note" in page  # depends on it now
    child = admin_client_for.get(f"/admin/memory/assertion/{b}/change/").content.decode()
    assert f"/admin/memory/assertion/{a}/change/" in child and "needs re-evaluation" in child
    listing = admin_client_for.get("/admin/memory/assertion/").content.decode()
    assert "preference.food" in listing and "habit.takeout_note" in listing


def test_an_admin_edit_is_a_new_version_through_the_commit_service(owner: Any, admin_client_for: Client) -> None:
    a = believe(owner, "不吃香菜")
    b = believe(owner, "外卖备注不要香菜", predicate="habit.takeout_note", deps=((a, 1),))
    response = admin_client_for.post(f"/admin/memory/assertion/{a}/change/", {"payload": json.dumps({"text": "香菜现在能吃了"}), "expected_version": "1"})
    assert response.status_code == 302
    assert list(AssertionVersion.objects.filter(assertion_id=a).values_list("version", "payload", "actor")) == [
        (1, {"text": "不吃香菜"}, "agent"), (2, {"text": "香菜现在能吃了"}, "owner"),
    ]
    assert Assertion.objects.get(id=b).needs_reevaluation
    stale = admin_client_for.post(f"/admin/memory/assertion/{a}/change/", {"payload": json.dumps({"text": "x"}), "expected_version": "1"})
    assert stale.status_code == 200 and "conflict" in stale.content.decode()
    assert AssertionVersion.objects.filter(assertion_id=a).count() == 2


def test_the_admin_shows_everything_that_will_be_forgotten_before_confirming(owner: Any, admin_client_for: Client) -> None:
    a = believe(owner, "不吃香菜")
    b = believe(owner, "外卖备注不要香菜", predicate="habit.takeout_note", deps=((a, 1),))
    c = believe(owner, "unrelated")
    preview = admin_client_for.get(f"/admin/memory/assertion/{a}/forget/").content.decode()
    assert preview.count('class="will-forget"') == 2 and "外卖备注不要香菜" in preview and "unrelated" not in preview
    assert "Not erased" in preview and "backups" in preview
    assert Assertion.objects.filter(state="active").count() == 3  # the preview changed nothing
    done = admin_client_for.post(f"/admin/memory/assertion/{a}/forget/", {"confirm": "yes"}, follow=True)
    assert done.status_code == 200 and "Forgot 2 assertions" in done.content.decode()
    assert set(Assertion.objects.filter(state="forgotten").values_list("id", flat=True)) == {uuid.UUID(a), uuid.UUID(b)}
    assert Assertion.objects.get(id=c).state == "active"


def test_the_admin_lists_what_needs_reevaluation(owner: Any, admin_client_for: Client) -> None:
    a = believe(owner, "不吃香菜")
    believe(owner, "外卖备注不要香菜", predicate="habit.takeout_note", deps=((a, 1),))
    assert 'class="reevaluate"' not in admin_client_for.get("/admin/memory/assertion/needs-reevaluation/").content.decode()
    assertions.commit(CommitRequest(owner_id=owner.pk, request_id="v2", predicate="preference.food", payload={"text": "能吃了"},
                                    expected_version=1, assertion_id=uuid.UUID(a)))
    page = admin_client_for.get("/admin/memory/assertion/needs-reevaluation/").content.decode()
    assert page.count('class="reevaluate"') == 1 and "外卖备注不要香菜" in page and "changed to version 2" in page


def test_only_the_owner_sees_memory_in_the_admin(owner: Any, django_user_model: Any) -> None:
    a = believe(owner, "不吃香菜")
    staff = django_user_model.objects.create_superuser("reviewer", password="pw-pw-pw-pw")
    client = Client()
    client.force_login(staff)
    assert client.get(f"/admin/memory/assertion/{a}/change/").status_code == 403
    assert client.get(f"/admin/memory/assertion/{a}/forget/").status_code == 403
    assert client.post(f"/admin/memory/assertion/{a}/forget/", {"confirm": "yes"}).status_code == 403
    assert Assertion.objects.get(id=a).state == "active"
