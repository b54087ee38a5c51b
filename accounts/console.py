"""The owner console's admin site: Django's admin, its index grouped by what the owner does.

Django lists the registered models app by app, alphabetically (49 of them in 11 sections
named after code packages). The owner thinks in tasks: what Yimi heard and did, what waits
for an answer, memory, models, packs, devices. ``OwnerConsoleSite.get_app_list`` groups
the index and the sidebar by ``TASKS``, in that order, each model in the order listed. A
model registered later and named in no task lands in "Other" at the end (never hidden);
``tests/accounts/test_owner_console_index.py`` fails while any does, so a new model is placed on
purpose. An app's own page (``/admin/<app_label>/``) stays Django's per-app list.

Models are named by ``app_label.model_name`` strings: this module imports no app above
accounts (the layers, pyproject.toml). ``ConsoleAdminConfig`` makes this the default site
(``INSTALLED_APPS``), so every ``@admin.register`` lands here.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig
from django.http import HttpRequest


class Task:
    def __init__(self, slug: str, name: str, models: tuple[str, ...]) -> None:
        self.slug, self.name, self.models = slug, name, models


TASKS: tuple[Task, ...] = (
    Task("timeline", "What Yimi heard and did", (
        "memory.timelineentry", "brain.run", "brain.agenttask", "capabilities.toolcall", "capabilities.receiptrecord",
        "devices.delivery", "voice.voiceutterance", "accounts.voicecall", "companion.callsnapshot",
    )),
    Task("cards", "Cards and permissions", (
        "consent.consentcard", "payments.paymentintent", "consent.rememberedconsent", "consent.ridepermission",
    )),
    Task("reminders", "Reminders, schedules and watches", (
        "schedules.reminder", "schedules.schedule", "schedules.watch", "schedules.watchnotice",
    )),
    Task("memory", "Memory", (
        "memory.assertion", "memory.place", "memory.locationreport", "memory.healthrecord", "memory.rawobject",
        "memory.coldpack", "memory.coldalert", "companion.privacyepoch",
    )),
    Task("models", "Models and persona", (
        "llm.modelrole", "llm.modelselection", "llm.modelroledraft", "llm.modelusage", "companion.personaversion",
        "companion.companionsettings", "companion.contentcard",
    )),
    Task("packs", "Packs", ("capabilities.registeredpack", "capabilities.packcandidate", "capabilities.secretgrant", "workshop.workshopbuild")),
    Task("devices", "Devices and who may speak", (
        "accounts.device", "accounts.pairingcode", "devices.macoperation", "accounts.voiceprintenrollment",
        "accounts.faceenrollment", "accounts.admissionrecord", "accounts.channelthreshold", "accounts.trustwindow",
    )),
    Task("releases", "Releases", ("releases.release", "releases.releaseevent", "releases.rollbackrequest", "releases.baselinecard")),
    Task("accounts", "Accounts", ("accounts.user", "auth.group")),
)
OTHER = Task("other", "Other", ())


class OwnerConsoleSite(admin.AdminSite):
    site_header = "Yimi"
    site_title = "Yimi admin"
    index_title = "Owner console"

    def get_app_list(self, request: HttpRequest, app_label: str | None = None) -> list[dict[str, Any]]:
        """The index and the sidebar: one section per task of ``TASKS`` the account can see
        anything in. With ``app_label`` (an app's own page): Django's list of that app."""
        if app_label is not None:
            return super().get_app_list(request, app_label)
        by_label = {
            model["model"]._meta.label_lower: model
            for app in self._build_app_dict(request).values()
            for model in app["models"]
        }
        sections = []
        placed: set[str] = set()
        for task in TASKS:
            models = [by_label[label] for label in task.models if label in by_label]
            placed.update(task.models)
            if models:
                sections.append(self._section(task, models))
        rest = sorted((m for label, m in by_label.items() if label not in placed), key=lambda m: m["name"])
        if rest:
            sections.append(self._section(OTHER, rest))
        return sections

    @staticmethod
    def _section(task: Task, models: list[dict[str, Any]]) -> dict[str, Any]:
        """A section in the shape Django's templates read for an app; its caption links to
        its first page."""
        return {
            "name": task.name, "app_label": f"task-{task.slug}", "app_url": models[0]["admin_url"] or "",
            "has_module_perms": True, "models": models,
        }


class ConsoleAdminConfig(AdminConfig):
    """``django.contrib.admin`` with ``OwnerConsoleSite`` as its default site."""

    default_site = "accounts.console.OwnerConsoleSite"
