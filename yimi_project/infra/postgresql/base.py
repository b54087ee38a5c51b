"""Django's PostgreSQL backend (``ENGINE = "yimi_project.infra.postgresql"``), with one change:
the connection pool takes its ``check`` callback from ``OPTIONS["pool"]["check"]``.

Django 5.2 builds the psycopg pool with ``check=ConnectionPool.check_connection`` when
``CONN_HEALTH_CHECKS`` is on (an empty query, a round trip, on every checkout) and
``check=None`` otherwise, and passes ``OPTIONS["pool"]`` beside it, so a ``check`` there
is an error. Here a ``check`` in the pool options replaces Django's choice
(settings: ``yimi_project.infra.db_pool.pooled_connection_check``); without one the pool is
exactly Django's.

Why: Django's own choice is a round trip on every checkout or no check at all (see
``yimi_project.infra.db_pool``). Drop it when Django passes a ``check`` from the pool options
to psycopg_pool itself (or offers a cheaper check); settings' ENGINE then goes back to
``django.db.backends.postgresql``. Tests: tests/yimi_project/test_db_pool_check.py, tests/yimi_project/test_db_pool.py.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self) -> Any:
        pool_options = self.settings_dict["OPTIONS"].get("pool")
        if self.alias == NO_DB_ALIAS or not isinstance(pool_options, dict) or "check" not in pool_options:
            return super().pool
        if self.alias not in self._connection_pools:
            if self.settings_dict.get("CONN_MAX_AGE", 0) != 0:
                return super().pool  # Django's ImproperlyConfigured: a pool wants CONN_MAX_AGE 0
            options = dict(pool_options)
            check = options.pop("check")
            connect_kwargs = self.get_connection_params()
            connect_kwargs["autocommit"] = True  # as Django: it sets the mode itself later
            pool = ConnectionPool(
                kwargs=connect_kwargs, open=False, configure=self._configure_connection, check=check, **options
            )
            pool = self._connection_pools.setdefault(self.alias, pool)  # as Django: the first of racing threads wins
            if hasattr(check, "sweeps"):
                check.sweeps(pool)  # a failed check sweeps the pool's other idle connections
        return self._connection_pools[self.alias]
