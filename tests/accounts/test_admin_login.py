"""Admin login lockout (django-axes): five wrong passwords for one username from one
address lock that pair out; the right password is refused too until the cool-off passes
or the lockout is reset."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery"  # the owner fixture's
ADDRESS = "198.51.100.7"


def log_in(client: Client, password: str, **headers: Any) -> Any:
    return client.post("/admin/login/?next=/admin/", {"username": "owner", "password": password}, **headers)


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def test_repeated_failed_admin_logins_lock_out_and_the_right_password_is_refused_too(owner: Any, settings: Any) -> None:
    client = Client(REMOTE_ADDR=ADDRESS)
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert log_in(client, "wrong password").status_code == 200  # the form again, with an error
    assert log_in(client, "wrong password").status_code == 429
    refused = log_in(client, PASSWORD)
    assert refused.status_code == 429 and not logged_in(client)
    # the lockout is for this username from this address
    elsewhere = Client(REMOTE_ADDR="198.51.100.8")
    assert log_in(elsewhere, PASSWORD).status_code == 302 and logged_in(elsewhere)


def test_a_lockout_is_lifted_with_axes_reset(owner: Any, settings: Any) -> None:
    client = Client(REMOTE_ADDR=ADDRESS)
    for _ in range(settings.AXES_FAILURE_LIMIT):
        log_in(client, "wrong password")
    assert log_in(client, PASSWORD).status_code == 429
    call_command("axes_reset_ip_username", ADDRESS, "owner")
    assert log_in(client, PASSWORD).status_code == 302 and logged_in(client)


def test_failures_count_against_remote_addr_whatever_x_forwarded_for_says(owner: Any, settings: Any) -> None:
    client = Client(REMOTE_ADDR=ADDRESS)
    for i in range(settings.AXES_FAILURE_LIMIT):
        log_in(client, "wrong password", HTTP_X_FORWARDED_FOR=f"203.0.113.{i}")
    assert log_in(client, PASSWORD, HTTP_X_FORWARDED_FOR="203.0.113.99").status_code == 429


def test_a_successful_login_starts_the_count_again(owner: Any, settings: Any) -> None:
    client = Client(REMOTE_ADDR=ADDRESS)
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        log_in(client, "wrong password")
    assert log_in(client, PASSWORD).status_code == 302
    client.logout()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert log_in(client, "wrong password").status_code == 200
    assert log_in(client, PASSWORD).status_code == 302


def test_lockouts_are_not_in_the_admin(owner: Any) -> None:
    from django.contrib import admin

    assert not [m for m in admin.site._registry if m._meta.app_label == "axes"]
