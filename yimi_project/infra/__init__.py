"""Every patch or replacement of a framework's behaviour, in one place: what to re-check when
Channels, channels_redis, daphne/autobahn, Django's database layer, psycopg or httpx is
upgraded. Each module's docstring says what it patches, why, and what would let us drop it.

Wired by settings, ``test_settings`` or ``asgi``; no app imports them (the import-linter
contract "Framework patches are wired, not imported" in pyproject.toml):

- ``channel_layers``: channels_redis's and Channels' in-memory layer: one round trip per
  group send, one reader per process inbox, no silent loss (``CHANNEL_LAYERS`` BACKEND).
- ``postgresql``: Django's PostgreSQL backend taking the pool's ``check`` from
  ``OPTIONS["pool"]`` (``DATABASES`` ENGINE).
- ``db_pool``: that ``check``: no round trip per checkout, a failed one sweeps the idle pool.
- ``test_postgresql``: the test database emptied with ``DELETE``, not ``TRUNCATE``
  (``test_settings``' ENGINE).
- ``websocket_transport``: daphne's websocket protocol closing with 1009/1007 instead of
  dropping, and sending 1011-1014 (``asgi``).
- ``body_limit``: a ceiling on HTTP bodies before Django's ASGI handler spools them (``asgi``).

Called by name (the apps' way in):

- ``statements``: the ORM's SQL for the hot paths' shapes, built once per model.
- ``http11``: one streamed HTTP/1.1 POST on asyncio streams and h11 instead of httpx, for
  model calls (``llm.client``).
"""
