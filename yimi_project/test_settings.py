"""Settings for the test suite: the same as production settings, except that runs
execute in-process (a Celery worker is started only by the end-to-end test), the
data directory is a temporary one, channel names get their own prefix, and on PostgreSQL
the test database is emptied and committed more cheaply (below)."""

import os
import shutil
import tempfile
from pathlib import Path

# The whole data directory is a temporary one unless the runner names one (YIMI_DATA_DIR):
# the production settings derive the secret key, the internal token, the workspace, mail and
# static directories from it at import, and a test run must never touch the checkout's ./var.
# Set in the environment, so the processes the tests start (daphne, Celery, packs) share it.
os.environ.setdefault("YIMI_DATA_DIR", tempfile.mkdtemp(prefix="yimi-test-data-"))

from yimi_project.settings import *  # noqa: E402, F403

# The test database and the internal socket get a directory of this run's own, even when the
# runner named a shared data directory.
DATA_DIR = Path(tempfile.mkdtemp(prefix="yimi-test-run-", dir=DATA_DIR))  # noqa: F405
YIMI_INTERNAL_SOCKET = DATA_DIR / "sockets" / "internal.sock"
# Packs run sandboxed wherever bubblewrap is installed (CI installs it, and there the
# sandbox tests fail instead of skipping without it); elsewhere they run unsandboxed.
YIMI_PACK_SANDBOX = "bwrap" if shutil.which("bwrap") else "none"
CELERY_BROKER_URL = None
YIMI_EMBEDDED_SWEEPER = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Several test runs may share one Redis (parallel checkouts): each can name its own prefix.
# Under pytest-xdist each worker process (PYTEST_XDIST_WORKER: gw0, gw1, ...) adds its name,
# so workers whose test databases hand out the same ids never share a channel group.
TEST_CHANNEL_PREFIX = os.environ.get("YIMI_TEST_CHANNEL_PREFIX", "yimi-test")
if os.environ.get("PYTEST_XDIST_WORKER"):
    TEST_CHANNEL_PREFIX += "-" + os.environ["PYTEST_XDIST_WORKER"]
if REDIS_URL:  # noqa: F405
    CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] = TEST_CHANNEL_PREFIX  # noqa: F405
# WS_AUTH_TIMEOUT_SECONDS stays production's 10 s, which a busy machine never hits; a test
# that needs the deadline to pass says when (DeviceConsumer.wait_auth_deadline).
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":  # noqa: F405
    # A file, not shared-cache memory: concurrent writers then wait on the lock
    # (busy timeout) as they do in the embedded default, instead of failing at once.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test.sqlite3")}  # noqa: F405
# Threads the tests use (sync_to_async, the internal pool) must not keep connections that
# would stop the test database from being dropped.
DATABASES["default"]["CONN_MAX_AGE"] = 0  # noqa: F405
if DATABASES["default"]["ENGINE"].endswith("postgresql"):  # noqa: F405
    # The production settings' backend with a cheaper flush after each transactional test
    # (rows deleted, not every table truncated): yimi_project/infra/test_postgresql/base.py.
    YIMI_TEST_BASE_DB_ENGINE = DATABASES["default"]["ENGINE"]  # noqa: F405
    DATABASES["default"]["ENGINE"] = "yimi_project.infra.test_postgresql"  # noqa: F405
    # The test database's commits do not wait for their WAL to reach the disk: a crash could
    # lose the last commits of a database that is thrown away anyway, and nothing a test sees
    # changes. Through libpq's PGOPTIONS, so the processes the tests start (daphne, Celery,
    # packs) inherit it. Production settings never set it.
    if "synchronous_commit" not in os.environ.get("PGOPTIONS", ""):
        os.environ["PGOPTIONS"] = f"{os.environ.get('PGOPTIONS', '')} -c synchronous_commit=off".strip()
