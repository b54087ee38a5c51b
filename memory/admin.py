"""The memory app's admin pages, registered when Django's admin imports this module: each
subpackage's ``admin`` module registers its own models."""

from memory.archive import admin as archive_admin  # noqa: F401 (registers the L5 originals and cold packs)
from memory.assertions import admin as assertions_admin  # noqa: F401 (registers assertions)
from memory.personal import admin as personal_admin  # noqa: F401 (registers location and health records)
from memory.timeline import admin as timeline_admin  # noqa: F401 (registers the timeline)
