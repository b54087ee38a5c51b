"""Settings for the test suite: the same as production settings, except that runs
execute in-process (a Celery worker is started only by the end-to-end test), the
data directory is a temporary one, and channel names get their own prefix."""

import os
import shutil
import tempfile
from pathlib import Path

from yimi_project.settings import *  # noqa: F403

DATA_DIR = Path(tempfile.mkdtemp(prefix="yimi-test-data-"))
YIMI_INTERNAL_SOCKET = DATA_DIR / "sockets" / "internal.sock"
# Packs run sandboxed wherever bubblewrap is installed (CI installs it, and there the
# sandbox tests fail instead of skipping without it); elsewhere they run unsandboxed.
YIMI_PACK_SANDBOX = "bwrap" if shutil.which("bwrap") else "none"
CELERY_BROKER_URL = None
YIMI_EMBEDDED_SWEEPER = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
if REDIS_URL:  # noqa: F405
    # Several test runs may share one Redis (parallel checkouts): each can name its own prefix.
    CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] = os.environ.get("YIMI_TEST_CHANNEL_PREFIX", "yimi-test")  # noqa: F405
# WS_AUTH_TIMEOUT_SECONDS stays production's 10 s, which a busy machine never hits; a test
# that needs the deadline to pass says when (DeviceConsumer.wait_auth_deadline).
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":  # noqa: F405
    # A file, not shared-cache memory: concurrent writers then wait on the lock
    # (busy timeout) as they do in the embedded default, instead of failing at once.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test.sqlite3")}  # noqa: F405
# Threads the tests use (sync_to_async, the internal pool) must not keep connections that
# would stop the test database from being dropped.
DATABASES["default"]["CONN_MAX_AGE"] = 0  # noqa: F405
