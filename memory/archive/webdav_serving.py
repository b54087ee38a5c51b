"""wsgidav's configuration for Yimi's own cold storage, shared by ``manage.py cold_webdav``
(the embedded default, on 127.0.0.1) and compose's ``cold-storage`` service
(docker/cold-storage/serve.py, on the compose network). Imports nothing of Django, so the
compose service runs without the platform's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def wsgidav_config(root: Path, host: str, port: int, user: str, password: str) -> dict[str, Any]:
    """``root`` served at ``/``, basic auth for one user, no directory browser."""
    return {
        "host": host,
        "port": port,
        "provider_mapping": {"/": str(root)},
        "http_authenticator": {"domain_controller": None, "accept_basic": True, "accept_digest": False, "default_to_digest": False},
        "simple_dc": {"user_mapping": {"*": {user: {"password": password}}}},
        # No directory browser: its middleware would mount an extra asset share at /:dir_browser.
        "dir_browser": {"enable": False},
        "middleware_stack": ["wsgidav.error_printer.ErrorPrinter", "wsgidav.http_authenticator.HTTPAuthenticator",
                             "wsgidav.request_resolver.RequestResolver"],
        "verbose": 1,
        "logging": {"enable_loggers": []},
    }
