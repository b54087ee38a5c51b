"""The admin index is grouped by what the owner does (accounts.console): timeline and runs,
cards, reminders, memory, models, packs, devices, releases, accounts; not Django's
alphabetical list of code packages."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib import admin
from django.test import Client

from accounts.console import TASKS, OwnerConsoleSite

pytestmark = pytest.mark.django_db


def sections(page: str) -> list[tuple[str, list[str]]]:
    """(caption, [model link, ...]) of each section of an admin index page, in order."""
    out = []
    for match in re.finditer(r'<div class="app-(task-[a-z]+) module.*?<caption>.*?>([^<]+)</a>(.*?)</table>', page, re.S):
        out.append((match.group(2), re.findall(r'<th scope="row"[^>]*>\s*<a href="([^"]+)"', match.group(3))))
    return out


def test_the_index_is_grouped_by_the_owners_tasks_in_order(owner: Any) -> None:
    client = Client()
    client.force_login(owner)
    page = client.get("/admin/").content.decode()
    shown = sections(page)
    assert [caption for caption, _ in shown] == [task.name for task in TASKS]
    links = dict(shown)
    assert links["What Yimi heard and did"][:2] == ["/admin/memory/timelineentry/", "/admin/brain/run/"]
    assert links["Memory"][0] == "/admin/memory/assertion/"
    assert links["Models and persona"][:2] == ["/admin/llm/modelrole/", "/admin/llm/modelselection/"]
    assert links["Packs"][0] == "/admin/capabilities/registeredpack/"
    assert links["Devices and who may speak"][0] == "/admin/accounts/device/"
    assert ">Watches<" in page and "Watchs" not in page
    # the sidebar on every other page has the same sections
    sidebar = client.get("/admin/brain/run/").content.decode()
    assert [caption for caption, _ in sections(sidebar)] == [task.name for task in TASKS]


def test_every_registered_model_is_placed_in_a_task() -> None:
    """A new admin lands in "Other" until it is placed in accounts.console.TASKS."""
    registered = {model._meta.label_lower for model in admin.site._registry}
    placed = {label for task in TASKS for label in task.models}
    assert isinstance(admin.site, OwnerConsoleSite)
    assert registered - placed == set()
    assert placed - registered == set(), "a task names a model that has no admin"


def test_an_apps_own_page_stays_djangos_list_of_that_app(owner: Any) -> None:
    client = Client()
    client.force_login(owner)
    page = client.get("/admin/schedules/").content.decode()
    assert 'class="app-schedules module' in page and "/admin/schedules/watch/" in page
