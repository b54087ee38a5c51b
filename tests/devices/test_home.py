"""``/`` is the owner's home: the admin login when signed out, 403 for any other account,
and for the owner the brain (demo or real, answering or not), what Yimi is doing now, how
many packs are on, and links to what the owner manages in the console."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from accounts.models import Device, User
from capabilities.manifest import load_packs
from llm import probe, roles
from tests.support.ports import free_port


@pytest.mark.django_db
def test_home_signed_out_is_the_admin_login() -> None:
    response = Client().get("/")
    assert response.status_code == 302
    assert response["Location"] == "/admin/login/?next=/"


@pytest.mark.django_db
def test_home_is_403_for_an_account_that_is_not_the_owner(owner: Any) -> None:
    other = User.objects.create_superuser("second", password="another horse battery")
    client = Client()
    client.force_login(other)
    assert client.get("/").status_code == 403


@pytest.mark.django_db
def test_home_shows_the_owner_what_yimi_is_doing(owner: Any, make_device: Any) -> None:
    phone = make_device("phone").device
    Device.objects.filter(pk=phone.pk).update(last_seen_at=timezone.now())
    mac = make_device("mac").device
    client = Client()
    client.force_login(owner)
    response = client.get("/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "No open runs." in page
    assert "No consent or payment card is waiting." in page
    assert list(response.context["devices_recent"]) == [phone]
    assert list(response.context["devices_other"]) == [mac]
    for link in ("/admin/", "/admin/accounts/device/", "/admin/brain/run/", "/api/health/"):
        assert f'href="{link}"' in page


@pytest.fixture
def probe_afresh() -> Iterator[None]:
    """The brain probe keeps its result a few seconds per process: each test probes anew."""
    probe.forget()
    yield
    probe.forget()


def home_page(owner: Any) -> str:
    client = Client()
    client.force_login(owner)
    response = client.get("/")
    assert response.status_code == 200
    return response.content.decode()



def test_home_links_to_what_the_owner_manages(owner: Any, probe_afresh: None) -> None:
    page = home_page(owner)
    manage = page[page.index('<nav class="manage">'):]
    manage = manage[: manage.index("</nav>")]
    assert re.findall(r'href="([^"]+)">([^<]+)<', manage) == [
        ("/admin/memory/timelineentry/", "Timeline"), ("/admin/memory/assertion/", "Memory"),
        ("/admin/llm/modelrole/", "Models"), ("/admin/capabilities/registeredpack/", "Packs"),
        ("/admin/accounts/device/", "Devices"),
    ]


def test_home_says_the_brain_is_the_demo_one_and_that_it_answers(owner: Any, brain: Any, probe_afresh: None) -> None:
    page = home_page(owner)
    assert "The <strong>demo brain</strong>: scripted answers, not a real model." in page
    assert '<p class="answering">Answering.</p>' in page


def test_home_says_a_real_brain_that_does_not_answer(owner: Any, probe_afresh: None) -> None:
    roles.import_from_environment({})
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    roles.apply("brain", provider="acme", base_url=url, model="acme-large", options=None, api_key=None, source="console")
    page = home_page(owner)
    assert "demo brain" not in page
    assert f"A real model: <strong>acme-large</strong> at {url}" in page
    assert '<p class="not-answering">Not answering (brain_unreachable): cannot connect to' in page


def test_home_says_a_real_brain_that_answers(owner: Any, fake_brain: Any, probe_afresh: None) -> None:
    roles.import_from_environment({})
    roles.apply("brain", provider="acme", base_url=fake_brain.base_url, model="acme-large", options=None, api_key=None,
                source="console")
    page = home_page(owner)
    assert "A real model: <strong>acme-large</strong>" in page and '<p class="answering">Answering.</p>' in page


def test_home_counts_the_packs_that_are_on(owner: Any, settings: Any, probe_afresh: None) -> None:
    settings.YIMI_PACKS_ENABLE, settings.YIMI_PACKS_DISABLE = [], []
    packs = load_packs()
    page = home_page(owner)
    assert f"{len(packs.packs)} on, {len(packs.disabled) + len(packs.refused)} off." in page
    settings.YIMI_PACKS_DISABLE = [sorted(packs.packs)[0]]
    assert f"{len(packs.packs) - 1} on, {len(packs.disabled) + len(packs.refused) + 1} off." in home_page(owner)
