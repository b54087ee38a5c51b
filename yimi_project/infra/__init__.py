"""Every patch or replacement of a framework's behaviour, in one place: what to re-check when
Channels, channels_redis, daphne/autobahn, Django's database layer, psycopg or httpx is
upgraded. Each module's docstring says what it patches, why, and what would let us drop it.

Wired by settings, ``test_settings`` or ``asgi``; no app imports them (the import-linter
contract "Framework patches are wired, not imported" in pyproject.toml):

- ``channel_layers``: channels_redis's and Channels' in-memory layer: one round trip per
  group send, one reader per process inbox, no silent loss (``CHANNEL_LAYERS`` BACKEND).
  Kept: correctness, and 52-64% less CPU per text than channels_redis
  (docs/decisions/2026-12-03-channel-layer.md).
- ``postgresql``: Django's PostgreSQL backend taking the pool's ``check`` from
  ``OPTIONS["pool"]`` (``DATABASES`` ENGINE).
- ``db_pool``: that ``check``: no round trip per checkout, a failed one sweeps the idle pool.
  Both kept: correctness (docs/decisions/2026-12-03-postgresql-statements-and-pool.md).
- ``test_postgresql``: the test database emptied with ``DELETE``, not ``TRUNCATE``
  (``test_settings``' ENGINE). Kept: the suite's flush ~99% faster
  (docs/decisions/2026-12-03-test-database-flush.md).
- ``websocket_transport``: daphne's websocket protocol closing with 1009/1007 instead of
  dropping, and sending 1011-1014 (``asgi``). Kept: correctness
  (docs/decisions/2026-12-03-websocket-transport.md).
- ``body_limit``: a ceiling on HTTP bodies before Django's ASGI handler spools them (``asgi``).
  Kept: correctness (docs/decisions/2026-12-03-body-limit.md).

Called by name (the apps' way in):

- ``statements``: the ORM's SQL for the hot paths' shapes, built once per model. Kept: 41-43%
  less CPU per gateway call than the ORM (docs/decisions/2026-12-03-statements-built-once.md).
- ``http11``: one streamed HTTP/1.1 POST on asyncio streams and h11 instead of httpx, for
  model calls (``llm.client``). Kept: 60-65% less CPU per call than httpx
  (docs/decisions/2026-12-03-model-calls-over-h11.md).

Each record has a "Re-measured (step 3)" table: the figure, its floor, the load, the verdict.
The run lane (``brain.run_lane``, not a patch here: Celery's hand-over replaced for runs) is
kept on its CPU too (docs/decisions/2026-12-03-run-lane.md).
"""
