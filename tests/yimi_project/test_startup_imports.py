"""What every platform process pays for before it serves anything: a web process, a worker
and a ``manage.py`` command import Django's apps, the ASGI application, the Celery app and
the URL configuration. Libraries only some requests need are imported where they are used."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.process_support import ROOT

# A web process's and a worker's imports before they serve anything.
STARTUP_IMPORTS = """
import sys, django
django.setup()
import yimi_project.asgi, yimi_project.celery, brain.tasks, brain.runner, capabilities.client, capabilities.tasks
from django.urls import get_resolver
get_resolver().url_patterns
print(sorted({m.split(".")[0] for m in sys.modules} & {"mcp", "mcp_types", "PIL"}))
"""


def test_a_process_imports_neither_the_mcp_sdk_nor_pillow_until_it_needs_them() -> None:
    """The MCP SDK (its pydantic models) took about a second of every process's start and
    Pillow about 0.15 s, on a machine where the whole start took 5.4 s. The SDK is imported
    where a pack host is started or spoken to (``runtime._start``, ``host_parameters``, the
    contract, the registry's preload), Pillow where an upload is decoded
    (``memory.personal.images.inspect_image``): a process that does neither does not pay for them.
    The pack host and image tests still run those paths."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "yimi_project.settings"}
    out = subprocess.run([sys.executable, "-c", STARTUP_IMPORTS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
