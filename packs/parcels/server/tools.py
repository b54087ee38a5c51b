"""The parcels pack: a carrier's tracking service over HTTP (read only).

The service's base URL is the declared secret ``PARCELS_API_URL`` (a file in the secrets
directory; the sandbox passes it in the environment). ``GET {base}/track/{number}`` answers
``200 {"tracking_number", "carrier", "state", "last_event"}`` or ``404``. The pack declares
network egress, so its sandbox shares the host's network. Standard library only.

Never default to success: no URL configured is ``failed``/``not_configured``; a refused
connection is ``unknown``/``DISCONNECTED`` and a slow one ``unknown``/``TIMEOUT`` (the
state is not known, and nothing was changed: a read may be retried).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from capabilities.packkit import ToolRegistry, receipt

TOOLS = ToolRegistry()
URL_SECRET = "PARCELS_API_URL"
TIMEOUT_SECONDS = 10.0
SCHEMA = {
    "type": "object",
    "properties": {"tracking_number": {"type": "string", "minLength": 1, "maxLength": 64, "description": "the carrier's tracking number"}},
    "required": ["tracking_number"],
}


def number_of(args: dict[str, Any]) -> str | None:
    number = args.get("tracking_number")
    if not isinstance(number, str) or not number.strip() or len(number) > 64:
        return None
    return number.strip()


def tracked(body: dict[str, Any]) -> dict[str, Any]:
    """The receipt for a parcel the service knows (shared with the fake)."""
    content = {
        "tracking_number": str(body.get("tracking_number", "")),
        "carrier": str(body.get("carrier", "")),
        "state": str(body.get("state", "")),
        "last_event": str(body.get("last_event", "")),
    }
    return receipt("succeeded", summary=f"{content['tracking_number']}: {content['state']}", content=content)


def invalid() -> dict[str, Any]:
    return receipt("failed", error=("invalid_request", "tracking_number must be 1 to 64 characters"), retry="forbidden")


def not_found(number: str) -> dict[str, Any]:
    return receipt("failed", error=("not_found", f"the carrier knows no parcel {number}"), retry="forbidden")


@TOOLS("Track a parcel by its tracking number.", SCHEMA)
def track(args: dict[str, Any]) -> dict[str, Any]:
    number = number_of(args)
    if number is None:
        return invalid()
    base = os.environ.get(URL_SECRET, "").rstrip("/")
    if not base:
        return receipt("failed", error=("not_configured", f"the secret {URL_SECRET} is not set"), retry="forbidden")
    url = f"{base}/track/{urllib.parse.quote(number, safe='')}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response:  # noqa: S310 - the deployer's URL
            body = json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return not_found(number)
        return receipt("unknown", error=("carrier_error", f"HTTP {exc.code}"), retry="allowed", unknowns=["state"])
    except TimeoutError:
        return receipt("unknown", error=("TIMEOUT", "the carrier did not answer in time"), retry="allowed", unknowns=["state"])
    except (urllib.error.URLError, OSError) as exc:
        if isinstance(getattr(exc, "reason", None), TimeoutError):
            return receipt("unknown", error=("TIMEOUT", "the carrier did not answer in time"), retry="allowed", unknowns=["state"])
        return receipt("unknown", error=("DISCONNECTED", "the carrier could not be reached"), retry="allowed", unknowns=["state"])
    except ValueError:
        return receipt("unknown", error=("carrier_error", "the carrier's answer was unreadable"), retry="allowed", unknowns=["state"])
    if not isinstance(body, dict):
        return receipt("unknown", error=("carrier_error", "the carrier's answer was unreadable"), retry="allowed", unknowns=["state"])
    return tracked(body)
