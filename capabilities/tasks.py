"""Celery beat tasks of the capabilities app."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from capabilities.registry.monitor import monitor_cycle


@shared_task(name="capabilities.tasks.monitor_packs")
def monitor_packs() -> list[dict[str, Any]]:
    """The pack registry's maintenance cycle: health checks and Wilson comparisons of the
    Yimi-built packs online, reverting a version that fails or clearly regressed."""
    return monitor_cycle()
