"""memory's hand-built statements (PostgreSQL only: SQLite takes the ORM) and the parts other apps' statements take."""

# --- parts for devices (added by the devices helper) ---

from functools import cache  # noqa: E402

from django.db import connection  # noqa: E402

from memory.models import TimelineEntry  # noqa: E402
from yimi_project.infra import statements  # noqa: E402


@cache
def entry_of_seq(owner: str = "%s", seq: str = "%s") -> tuple[str, str, str]:
    """The owner's timeline entry ``seq`` as parts of a SELECT: its id column, the FROM table
    and the WHERE condition, ``owner`` and ``seq`` being SQL expressions (a placeholder each by
    default, the owner's first). devices' ACK inserts its delivery with ``SELECT <id>, … FROM
    <table> WHERE <condition>`` (``devices.queries.ack_sql``, ``devices.queries.first_delivery_sql``)."""
    column = statements.column_of(TimelineEntry, qualified=True)
    table = connection.ops.quote_name(TimelineEntry._meta.db_table)
    return column("id"), table, f"{column('owner')} = {owner} AND {column('seq')} = {seq}"
