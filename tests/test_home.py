"""``/`` is the owner's home: the admin login when signed out, 403 for any other account,
and for the owner what Yimi is doing now with links into the admin console."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from accounts.models import User
from devices.models import Device


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
    for link in ("/admin/", "/admin/devices/device/", "/admin/brain/run/", "/api/health/"):
        assert f'href="{link}"' in page
