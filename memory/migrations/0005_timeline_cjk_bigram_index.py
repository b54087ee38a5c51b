"""Chinese keyword search on PostgreSQL: the CJK character bigrams of every timeline entry in
a ``tsvector`` column, GIN-indexed (used by ``memory.recall.keyword_search``).

Two-character Chinese terms have no trigrams (and ``pg_trgm`` drops non-ASCII characters
under the C locale anyway), so before this a query such as 咖啡 scanned all of the owner's
rows. ``text_cjk_bigrams`` is a stored generated column: PostgreSQL computes it on every
insert and update of ``text`` (``yimi_cjk_bigrams``: each pair of adjacent CJK characters,
as-is, no dictionary: the ``simple`` treatment), and adding it computes it for every
existing row (the backfill). The model does not declare the column; nothing in Django
writes it. The GIN index is built without a pending list (``fastupdate = off``).

Nothing happens on SQLite (recall keeps its ``instr`` path there).
"""

from __future__ import annotations

from django.db import migrations

COLUMN = "text_cjk_bigrams"
INDEX = "memory_timeline_text_cjk_bigrams"
# The CJK ranges of memory.recall.query_terms (CJK_RUN): Extension A, Unified Ideographs,
# Compatibility Ideographs.
FUNCTION = r"""
CREATE OR REPLACE FUNCTION yimi_cjk_bigrams(t text) RETURNS tsvector
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT coalesce(array_to_tsvector(array_agg(DISTINCT substr(run[1], i, 2))), ''::tsvector)
    FROM regexp_matches(t, U&'[\3400-\9FFF\F900-\FAFF]{2,}', 'g') AS run,
         generate_series(1, char_length(run[1]) - 1) AS i
$$
"""


def add_bigram_column(apps, schema_editor) -> None:  # type: ignore[no-untyped-def]
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(FUNCTION)
        cursor.execute(
            f"ALTER TABLE memory_timelineentry ADD COLUMN IF NOT EXISTS {COLUMN} tsvector "
            f"GENERATED ALWAYS AS (yimi_cjk_bigrams(text)) STORED"
        )
        # fastupdate off: each insert goes straight into the index tree. With GIN's pending
        # list (the default) every search also reads the list linearly until it is merged,
        # up to 4 MB (measured: 26 ms instead of 0.01 ms for the index scan in bench/memory.py).
        # Timeline entries are written at the pace people talk; searches must stay fast.
        cursor.execute(
            f"CREATE INDEX IF NOT EXISTS {INDEX} ON memory_timelineentry USING gin ({COLUMN}) WITH (fastupdate = off)"
        )


def drop_bigram_column(apps, schema_editor) -> None:  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE memory_timelineentry DROP COLUMN IF EXISTS {COLUMN}")
            cursor.execute("DROP FUNCTION IF EXISTS yimi_cjk_bigrams(text)")


class Migration(migrations.Migration):
    dependencies = [("memory", "0004_history_lookup")]

    operations = [migrations.RunPython(add_bigram_column, drop_bigram_column)]
