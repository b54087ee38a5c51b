"""System checks of the memory app (``manage.py check``, and every ``runserver``/``migrate``)."""

from __future__ import annotations

import shutil
from typing import Any

from django.core.checks import CheckMessage, Warning, register

from memory.archive.coldpack import FFMPEG_MISSING


@register()
def ffmpeg_installed(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Cold packs encode 16-bit PCM originals as FLAC with ffmpeg (memory.archive.coldpack)."""
    if shutil.which("ffmpeg") is not None:
        return []
    return [Warning(FFMPEG_MISSING, hint="apt-get install ffmpeg", id="memory.W001")]
