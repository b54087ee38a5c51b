"""Keyword search over the timeline on PostgreSQL: pg_trgm and a GIN trigram index on
``memory_timelineentry.text`` (used by ``ILIKE`` in ``memory.recall.keyword_search``).

Nothing happens on SQLite (recall uses its LIKE fallback there). If the database role may
not create the extension, the migration still succeeds and recall runs without the index.
"""

from __future__ import annotations

from django.db import DatabaseError, migrations, transaction

INDEX = "memory_timeline_text_trgm"


def create_trigram_index(apps, schema_editor) -> None:  # type: ignore[no-untyped-def]
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm'")
        if cursor.fetchone() is None:
            try:
                with transaction.atomic(using=connection.alias):
                    cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
            except DatabaseError:
                return  # no privilege: recall works without the index
        cursor.execute(f"CREATE INDEX IF NOT EXISTS {INDEX} ON memory_timelineentry USING gin (text gin_trgm_ops)")


def drop_trigram_index(apps, schema_editor) -> None:  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(f"DROP INDEX IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    dependencies = [("memory", "0002_assertions")]

    operations = [migrations.RunPython(create_trigram_index, drop_trigram_index)]
