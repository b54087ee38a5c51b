"""Operations the migrations share.

A migration is history: an installed instance runs it once, a fresh database runs it on
every install, so what is here keeps its behaviour for every migration that names it
(change it only by adding a new function).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def move_content_types(models: tuple[str, ...], from_app: str, to_app: str) -> migrations.RunPython:
    """The content types of ``models`` (lower-case model names) follow the models from app
    ``from_app`` to ``to_app``, keeping their ids, so staff permissions and admin log entries
    that point at them survive the move; reversed, they go back. A model whose content type
    already exists under the target label keeps both rows as they are. On a fresh database
    there are none yet (Django makes them after ``migrate``) and nothing changes."""

    def move(old: str, new: str) -> Any:
        def run(apps: Any, schema_editor: Any) -> None:
            ContentType = apps.get_model("contenttypes", "ContentType")
            content_types = ContentType.objects.using(schema_editor.connection.alias)
            taken = set(content_types.filter(app_label=new, model__in=models).values_list("model", flat=True))
            content_types.filter(app_label=old, model__in=[m for m in models if m not in taken]).update(app_label=new)
            ContentType.objects.clear_cache()

        return run

    return migrations.RunPython(move(from_app, to_app), move(to_app, from_app))
