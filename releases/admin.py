"""The releases app in the console (owner-only)."""

from __future__ import annotations

from releases import (
    release_admin,  # noqa: F401  (registers Release and ReleaseEvent, read-only)
    request_admin,  # noqa: F401  (registers RollbackRequest and BaselineCard)
)
