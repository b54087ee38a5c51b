"""Row statements for hot paths, compiled once per model instead of once per call.

The ORM builds a query's SQL anew every time: for the gateway's decide + receipt (four
short statements) building them took as long as PostgreSQL took to run them. These
helpers issue the same SQL the ORM would for the shapes the hot paths need — insert one
model instance, fetch one row by primary key, and ``fetch``: run a SELECT the caller built
once from ``_meta`` and read its columns back by their fields — with the statement text built from the
model's ``_meta`` once (so a new column needs no edit here) and each value prepared by its
field exactly as ``Model.save`` and the query compiler do (``pre_save`` fills ``auto_now_add``,
``get_db_prep_save`` adapts JSON and UUIDs, ``from_db_value`` reads JSON back). They run on
Django's connection, so transactions, ``CaptureQueriesContext`` and the test database work
as with the ORM; a fixed statement text also lets psycopg prepare it server-side.

``insert_parts`` writes several rows in one statement (PostgreSQL), one row taking a value
the database computes in it or another row's new key.

``insert`` falls back to ``Model.save(force_insert=True)`` where the shortcut would change
behaviour: a model with its own ``save``, a model with ``pre_save``/``post_save``
receivers, or a database that cannot return the new primary key from an INSERT.

Replaces: the ORM's SQL compilation, for the hot paths' shapes only; the apps call it by
name (everything else stays on the ORM). Why: building the gateway's four statements took as
long as PostgreSQL took to run them (docs/decisions/2026-12-03-statements-built-once.md).
It leans on Django's internals, to check on a Django or psycopg upgrade: ``Model._state``,
``Model.from_db``, ``Field.pre_save``/``get_db_prep_save``/``get_db_converters``,
``connection.ops`` and ``features``, psycopg's ``prepare_threshold`` (``custom_plans``).
Drop it when the ORM keeps a query's compiled SQL per shape, so the hot paths can go back
to it. Tests: tests/yimi_project/test_prepared_statements.py, tests/capabilities/test_gateway_queries.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache, partial
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model
from django.db.models.signals import post_save, pre_save

M = TypeVar("M", bound=Model)


def _connection() -> BaseDatabaseWrapper:
    # The wrapper itself: ``django.db.connection`` is a proxy that looks the wrapper up
    # (a context-local) on every attribute access, and preparing values touches it often.
    return connections[DEFAULT_DB_ALIAS]


@cache
def _insert_statement(model: type[Model], vendor: str) -> tuple[str, tuple[Field[Any, Any], ...], Field[Any, Any] | None]:
    meta = model._meta
    pk = meta.pk
    assert pk is not None
    returned = pk if pk.db_returning else None  # an auto-increment id comes back from the INSERT
    fields = tuple(f for f in meta.concrete_fields if f is not returned)
    quote = _connection().ops.quote_name
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({columns(fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))})"
    )
    if returned is not None:
        sql += f" RETURNING {quote(str(returned.column))}"
    return sql, fields, returned


def _plain_insert(model: type[Model], connection: Any) -> bool:
    """Whether an INSERT of ``model`` may skip ``save``: no save of its own (it may fill
    columns), no save signals, and a database that returns columns from an INSERT."""
    return not (
        model.save is not Model.save
        or pre_save.has_listeners(model)
        or post_save.has_listeners(model)
        or not connection.features.can_return_columns_from_insert
    )


def insert(obj: Model) -> None:
    """INSERT ``obj`` as a new row (as ``obj.save(force_insert=True)``), in one statement."""
    model = type(obj)
    connection = _connection()
    if not _plain_insert(model, connection):
        obj.save(force_insert=True)
        return
    sql, fields, returned = _insert_statement(model, connection.vendor)
    values = [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        if returned is not None:
            row = cursor.fetchone()
            assert row is not None
            setattr(obj, returned.attname, row[0])
    obj._state.adding = False
    obj._state.db = connection.alias


def insert_with(obj: Model, field: str, with_sql: str, with_params: list[Any]) -> bool:
    """INSERT ``obj`` with the value of ``field`` taken from a data-modifying query run in the
    same statement (PostgreSQL only): ``WITH computed AS (with_sql) INSERT … SELECT …,
    computed.value, … FROM computed``, where ``with_sql`` returns one row with one column
    named ``value``. ``obj`` gets that value and its key. False, with nothing written, where
    it cannot be one statement (another database, a model with its own save or save
    signals): the caller takes the two-statement way."""
    return insert_parts([Part(obj, computed=field)], with_sql, with_params)


@dataclass(frozen=True)
class Part:
    """One row of ``insert_parts``: ``obj``, with ``computed`` (a field) taking the value of
    the statement's ``computed`` query, and each field named in ``takes`` taking the key of
    the earlier part at that index (a foreign key to a row inserted in the same statement)."""

    obj: Model
    computed: str | None = None
    takes: tuple[tuple[str, int], ...] = ()


def insert_parts(parts: Sequence[Part], with_sql: str | None = None, with_params: Sequence[Any] = ()) -> bool:
    """INSERT several rows in one statement (PostgreSQL only), each a data-modifying WITH
    query: ``WITH computed AS (with_sql), p0 AS (INSERT …), p1 AS (INSERT … SELECT …, p0.key,
    … FROM p0) …``. One statement is atomic without BEGIN and COMMIT, and a row may take a
    value only the database knows yet (a sequence number, an auto-increment key). Each
    object gets its computed value and its database-made key. False, with nothing written,
    where it cannot be one statement (another database, a model with its own save or save
    signals): the caller takes the statement-per-row way. Foreign keys between the rows
    are checked once every row is in (Django's are deferred: at COMMIT, which in autocommit
    is the statement's end)."""
    if (with_sql is None) != all(p.computed is None for p in parts):
        raise ValueError("insert_parts: with_sql is given exactly when a part has a computed field")
    connection = _connection()
    if not in_one_statement(*(type(p.obj) for p in parts)):
        return False
    shape = tuple((type(p.obj), p.computed, p.takes) for p in parts)
    sql, plans = _parts_statement(shape, with_sql)
    params: list[Any] = list(with_params)
    for part, (fields, _, _) in zip(parts, plans, strict=True):
        params += [f.get_db_prep_save(f.pre_save(part.obj, True), connection) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    assert row is not None
    values = iter(row)
    for part, (_, computed, key) in zip(parts, plans, strict=True):
        if key is not None:
            setattr(part.obj, key.attname, next(values))
        if computed is not None:
            setattr(part.obj, computed.attname, next(values))
        for name, j in part.takes:
            setattr(part.obj, part.obj._meta.get_field(name).attname, parts[j].obj.pk)  # type: ignore[union-attr]
        part.obj._state.adding = False
        part.obj._state.db = connection.alias
    return True


def insert_values(obj: Model) -> tuple[tuple[Field[Any, Any], ...], list[Any]]:
    """The fields ``insert`` writes for ``obj`` (all concrete ones but a database-made key),
    in order, and their values prepared as ``insert`` prepares them: for a caller that
    writes the row inside a statement of its own."""
    connection = _connection()
    fields = insert_fields(type(obj))
    return fields, [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]


def insert_fields(model: type[Model]) -> tuple[Field[Any, Any], ...]:
    """The fields ``insert`` writes for ``model``, in order (``insert_values``')."""
    return _insert_statement(model, _connection().vendor)[1]


def on_postgresql() -> bool:
    """Whether the hot paths run their hand-built statements (each app's ``queries`` module)
    here: on PostgreSQL. Every other database (SQLite, the embedded default) takes the ORM,
    the one fallback (docs/decisions/2026-12-03-sql-contained.md)."""
    return _connection().vendor == "postgresql"


def in_one_statement(*models: type[Model]) -> bool:
    """Whether ``insert_parts`` writes rows of ``models`` in one statement here (PostgreSQL,
    plain models): a caller that needs them atomic may then skip its transaction."""
    connection = _connection()
    return connection.vendor == "postgresql" and all(_plain_insert(model, connection) for model in models)


@cache
def _parts_statement(
    shape: tuple[tuple[type[Model], str | None, tuple[tuple[str, int], ...]], ...], with_sql: str | None
) -> tuple[str, tuple[tuple[tuple[Field[Any, Any], ...], Field[Any, Any] | None, Field[Any, Any] | None], ...]]:
    """``insert_parts``' statement for one shape (the models, their computed fields and
    links), built once, and per part: the fields whose values the caller passes, in order,
    the computed field and the database-made key (each read back, in that order)."""
    quote = _connection().ops.quote_name
    queries = [f"computed AS ({with_sql})"] if with_sql is not None else []
    selected, plans = [], []
    for i, (model, computed_name, takes) in enumerate(shape):
        _, fields, key = _insert_statement(model, "postgresql")
        linked = {model._meta.get_field(name): f"p{j}.k" for name, j in takes}
        computed = next(f for f in fields if f.name == computed_name) if computed_name is not None else None
        sources = (["computed"] if computed is not None else []) + sorted({f"p{j}" for _, j in takes})
        values = ", ".join("computed.value" if f is computed else linked.get(f, "%s") for f in fields)
        body = f"SELECT {values} FROM {', '.join(sources)}" if sources else f"VALUES ({values})"
        back = [f"{quote(str(model._meta.pk.column))} AS k"]  # type: ignore[union-attr]
        if key is not None:
            selected.append(f"p{i}.k")
        if computed is not None:
            back.append(f"{quote(str(computed.column))} AS v")
            selected.append(f"p{i}.v")
        queries.append(f"p{i} AS (INSERT INTO {quote(model._meta.db_table)} ({columns(fields)}) {body} RETURNING {', '.join(back)})")
        plans.append((tuple(f for f in fields if f is not computed and f not in linked), computed, key))
    sql = f"WITH {', '.join(queries)} SELECT {', '.join(selected) or '1'} FROM {', '.join(f'p{i}' for i in range(len(shape)))}"
    return sql, tuple(plans)


@cache
def _fetch_statement(
    model: type[Model], field_names: tuple[str, ...], vendor: str
) -> tuple[str, tuple[str, ...], tuple[tuple[int, tuple[Any, ...], Any], ...]]:
    meta = model._meta
    pk = meta.pk
    assert pk is not None
    wanted = {pk} | {meta.get_field(name) for name in field_names}  # an instance always holds its key
    fields = [f for f in meta.concrete_fields if f in wanted]  # from_db wants them in this order
    if len(fields) != len(wanted):
        raise ValueError(f"{model.__name__}: not all of {field_names} are concrete fields")
    quote = _connection().ops.quote_name
    sql = (
        f"SELECT {columns(fields)} FROM {quote(meta.db_table)} "
        f"WHERE {quote(str(pk.column))} = %s LIMIT 1"
    )
    return sql, tuple(f.attname for f in fields), _converters(tuple(fields), vendor)


@cache
def _converters(fields: tuple[Field[Any, Any], ...], vendor: str) -> tuple[tuple[int, tuple[Any, ...], Any], ...]:
    """(column index, the field's converters, its column) for the columns that need converting."""
    connection = _connection()
    converters = []
    for i, f in enumerate(fields):
        col = f.get_col(f.model._meta.db_table)
        found = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
        if found:
            converters.append((i, tuple(found), col))
    return tuple(converters)


def _convert(row: Any, converters: tuple[tuple[int, tuple[Any, ...], Any], ...], connection: BaseDatabaseWrapper) -> list[Any]:
    values = list(row)
    for i, found, col in converters:
        for convert in found:
            values[i] = convert(values[i], col, connection)
    return values


def fetch_by_pk(model: type[M], pk: Any, field_names: tuple[str, ...]) -> M | None:
    """The row with primary key ``pk`` as an instance holding ``field_names`` and its key
    (the others are deferred, as with ``only()``), or None."""
    connection = _connection()
    sql, attnames, converters = _fetch_statement(model, field_names, connection.vendor)
    key = model._meta.pk.get_db_prep_value(pk, connection)  # type: ignore[union-attr]
    with connection.cursor() as cursor:
        cursor.execute(sql, [key])
        row = cursor.fetchone()
    if row is None:
        return None
    return model.from_db(connection.alias, attnames, _convert(row, converters, connection))


def column(model: type[Model], name: str, *, qualified: bool = False) -> str:
    """The quoted column of ``model``'s field ``name`` (``table.column`` if ``qualified``),
    for statement text built once from ``_meta``."""
    field = model._meta.get_field(name)
    assert isinstance(field, Field), f"{model.__name__}.{name} is not a concrete field"
    quote = _connection().ops.quote_name
    return f"{quote(model._meta.db_table)}.{quote(str(field.column))}" if qualified else quote(str(field.column))


def column_of(model: type[Model], *, qualified: bool = False) -> Callable[[str], str]:
    """``column`` for one model, for statement text naming many of its columns:
    ``c = column_of(Run)`` then ``c("state")``."""
    return partial(column, model, qualified=qualified)


def columns(fields: Iterable[Field[Any, Any]], *, qualified: bool = False) -> str:
    """The quoted columns of ``fields``, comma-separated: a SELECT list for statement text
    built once from ``_meta`` (``table.column`` each if ``qualified``, for a join; each
    field's own model's table)."""
    quote = _connection().ops.quote_name
    if qualified:
        return ", ".join(f"{quote(f.model._meta.db_table)}.{quote(str(f.column))}" for f in fields)
    return ", ".join(quote(str(f.column)) for f in fields)


def fetch(sql: str, params: list[Any], fields: tuple[Field[Any, Any], ...]) -> list[list[Any]]:
    """The rows of a SELECT whose text the caller built once (from ``_meta``), each column
    read back by its field in ``fields`` (one per selected column, in order) as the query
    compiler would (JSON decoded, booleans and datetimes of SQLite converted). ``params``
    must already be database values (ids, strings, booleans)."""
    connection = _connection()
    converters = _converters(fields, connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return [_convert(row, converters, connection) for row in rows]


def fetch_instances(model: type[M], sql: str, params: list[Any], fields: tuple[Field[Any, Any], ...]) -> list[M]:
    """``fetch``'s rows as instances of ``model`` (``fields``: all of its concrete fields,
    in ``_meta`` order, as the SELECT lists them)."""
    return [instance(model, fields, values) for values in fetch(sql, params, fields)]


def instance(model: type[M], fields: tuple[Field[Any, Any], ...], values: list[Any]) -> M:
    """An instance of ``model`` from converted ``values`` of its ``fields`` (in
    ``_meta.concrete_fields`` order, the key among them), as a queryset would build it."""
    return model.from_db(_connection().alias, [f.attname for f in fields], values)


@contextlib.contextmanager
def custom_plans() -> Iterator[None]:
    """Statements run inside are not prepared, so PostgreSQL plans each run with its own
    parameter values. For a query whose best plan depends on them: a prepared statement gets
    a generic plan after five runs (settings: ``YIMI_DB_PREPARE_THRESHOLD``), and for the
    keyword search that plan made a rare 2-character term 80 times slower than the plan its
    values want (bench/memory.py: 0.2 ms → 18 ms). Elsewhere, and on SQLite, nothing changes."""
    connection = _connection()
    if connection.vendor != "postgresql":
        yield
        return
    connection.ensure_connection()
    raw = connection.connection
    saved = raw.prepare_threshold
    raw.prepare_threshold = None  # psycopg: prepare nothing, use no prepared statement
    try:
        yield
    finally:
        raw.prepare_threshold = saved
