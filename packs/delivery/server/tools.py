"""The delivery pack: parcels by tracking number at a carrier's tracking service over HTTP,
and the parcels the owner follows ("快递到了告诉我") through the platform's watches.

- ``track`` (observe) asks the carrier. Its base URL is the declared secret
  ``PARCELS_API_URL`` (a file in the secrets directory; the sandbox passes it in the
  environment). ``GET {base}/track/{number}`` answers ``200 {"tracking_number", "carrier",
  "state", "last_event"}`` or ``404``. The receipt's ``content.arrival`` is ``delivered``
  when the carrier's state is ``delivered`` and ``not_delivered`` otherwise: the state the
  watches read.
- ``list`` (observe) and ``follow`` (owner_data on the ``tracking_number``; ``stop: true``
  ends following) call ``/internal/watches/parcels/`` on the platform socket with the
  capability of the call being executed (``schedules.parcels``). ``follow`` first asks the
  carrier: an unknown number is ``not_found`` and a delivered parcel is not followed.

Never default to success: no URL configured is ``failed``/``not_configured``; a refused
connection is ``unknown``/``DISCONNECTED`` and a slow one ``unknown``/``TIMEOUT`` (the
state is not known, nothing was changed: a read may be retried). A connection to the
platform lost during a follow is ``unknown`` (check with ``list``). The fake
(``fake/tools.py``) replaces ``fetch`` (the carrier) and ``call`` (the platform).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from capabilities.packkit import PlatformLost, PlatformNotConfigured, ToolRegistry, effect, platform_call, receipt, value

TOOLS = ToolRegistry()
URL_SECRET = "PARCELS_API_URL"
TIMEOUT_SECONDS = 10.0
SOURCE = "yimi watches"
NUMBER = {"type": "string", "minLength": 1, "maxLength": 64, "description": "the carrier's tracking number"}
SCHEMA = {"type": "object", "properties": {"tracking_number": NUMBER}, "required": ["tracking_number"]}
LIST_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
FOLLOW_SCHEMA = {
    "type": "object",
    "properties": {
        "tracking_number": NUMBER,
        "stop": {"type": "boolean", "description": "stop following this parcel (default: follow it)"},
        "label": {"type": "string", "maxLength": 100, "description": "what the notice calls it (default: 快递 <number>)"},
    },
    "required": ["tracking_number"],
}


class CarrierProblem(Exception):
    """The carrier could not tell (``code``: DISCONNECTED, TIMEOUT, carrier_error)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def number_of(args: dict[str, Any]) -> str | None:
    number = args.get("tracking_number")
    if not isinstance(number, str) or not number.strip() or len(number) > 64:
        return None
    return number.strip()


def fetch(number: str) -> dict[str, Any] | None:
    """The carrier's answer for ``number``; None if it knows no such parcel."""
    base = os.environ.get(URL_SECRET, "").rstrip("/")
    if not base:
        raise PlatformNotConfigured(f"the secret {URL_SECRET} is not set")
    url = f"{base}/track/{urllib.parse.quote(number, safe='')}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response:  # noqa: S310 - the deployer's URL
            body = json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise CarrierProblem("carrier_error", f"HTTP {exc.code}") from None
    except TimeoutError:
        raise CarrierProblem("TIMEOUT", "the carrier did not answer in time") from None
    except (urllib.error.URLError, OSError) as exc:
        if isinstance(getattr(exc, "reason", None), TimeoutError):
            raise CarrierProblem("TIMEOUT", "the carrier did not answer in time") from None
        raise CarrierProblem("DISCONNECTED", "the carrier could not be reached") from None
    except ValueError:
        raise CarrierProblem("carrier_error", "the carrier's answer was unreadable") from None
    if not isinstance(body, dict):
        raise CarrierProblem("carrier_error", "the carrier's answer was unreadable")
    return body


def tracked(body: dict[str, Any]) -> dict[str, Any]:
    """The receipt for a parcel the carrier knows."""
    state = str(body.get("state", ""))
    content = {
        "tracking_number": str(body.get("tracking_number", "")), "carrier": str(body.get("carrier", "")), "state": state,
        "last_event": str(body.get("last_event", "")), "arrival": "delivered" if state == "delivered" else "not_delivered",
    }
    return receipt("succeeded", summary=f"{content['tracking_number']}: {state}", content=content)


def invalid(message: str = "tracking_number must be 1 to 64 characters") -> dict[str, Any]:
    return receipt("failed", error=("invalid_request", message), retry="forbidden")


def not_found(number: str) -> dict[str, Any]:
    return receipt("failed", error=("not_found", f"the carrier knows no parcel {number}"), retry="forbidden")


def track_number(number: str) -> dict[str, Any]:
    try:
        body = fetch(number)
    except PlatformNotConfigured as exc:
        return receipt("failed", error=("not_configured", str(exc)), retry="forbidden")
    except CarrierProblem as exc:
        return receipt("unknown", error=(exc.code, str(exc)), retry="allowed", unknowns=["state"])
    return not_found(number) if body is None else tracked(body)


@TOOLS("Track a parcel by its tracking number.", SCHEMA)
def track(args: dict[str, Any]) -> dict[str, Any]:
    number = number_of(args)
    return invalid() if number is None else track_number(number)


def call(body: dict[str, Any]) -> tuple[int, Any]:
    """One request to ``/internal/watches/parcels/``: (HTTP status, parsed JSON or None)."""
    return platform_call("POST", "watches/parcels/", body)


def ask(body: dict[str, Any], expect: str, *, changes: bool) -> dict[str, Any]:
    """Call the platform; its dict payload on 200, else the failed/unknown receipt (key ``_receipt``)."""
    try:
        status, payload = call(body)
    except PlatformNotConfigured as exc:
        return {"_receipt": receipt("failed", error=("not_configured", str(exc)), retry="forbidden")}
    except PlatformLost as exc:
        if changes:
            return {"_receipt": receipt("unknown", summary=str(exc), unknowns=["whether it changed"], retry="after_check",
                                        check_with="list", error=(exc.code, str(exc)))}
        return {"_receipt": receipt("unknown", summary=str(exc), unknowns=["the answer"], retry="allowed", error=(exc.code, str(exc)))}
    if status == 200 and isinstance(payload, dict) and expect in payload:
        return payload
    error = payload.get("error") if isinstance(payload, dict) else None
    code = str(error.get("code")) if isinstance(error, dict) and error.get("code") else f"http_{status}"
    message = str(error.get("message", "")) if isinstance(error, dict) else f"the platform answered HTTP {status}"
    if status >= 500 and changes:
        return {"_receipt": receipt("unknown", summary=f"the platform failed during the change (HTTP {status})", unknowns=["whether it changed"],
                                    retry="after_check", check_with="list", error=(code, message[:1000]))}
    retry = "allowed" if status >= 500 or status == 429 else "forbidden"
    return {"_receipt": receipt("failed", summary=message or code, retry=retry, error=(code, (message or code)[:1000]))}


def followed(args: dict[str, Any]) -> dict[str, Any]:
    answer = ask({"action": "list"}, "parcels", changes=False)
    if "_receipt" in answer:
        return answer["_receipt"]
    items = answer["parcels"]
    return receipt("succeeded", summary=f"{len(items)} followed parcels", values=[value("parcels", len(items), "parcel", SOURCE)],
                   content={"items": items})


followed.__name__ = "list"  # the tool's name (``list`` would hide the builtin here)
TOOLS("The parcels the owner follows, with the state their last check read (not_delivered, delivered; none before the first check).", LIST_SCHEMA)(followed)


@TOOLS("Follow a parcel by its tracking number: the owner is notified once when it is delivered. stop: true stops following it.", FOLLOW_SCHEMA)
def follow(args: dict[str, Any]) -> dict[str, Any]:
    number = number_of(args)
    if number is None:
        return invalid()
    stop, label = args.get("stop", False), args.get("label")
    if not isinstance(stop, bool) or (label is not None and (not isinstance(label, str) or len(label) > 100)):
        return invalid("stop is true or false, label a string of at most 100 characters")
    if stop:
        answer = ask({"action": "unfollow", "tracking_number": number}, "stopped", changes=True)
        if "_receipt" in answer:
            return answer["_receipt"]
        if not answer["stopped"]:
            return receipt("succeeded", summary=f"{number} was no longer followed", values=[value("stopped", 0, "watch", SOURCE)],
                           effects=[effect(f"parcel:{number}", "already_not_followed", "service_ack")],
                           content={"tracking_number": number, "stopped": []})
        return receipt("succeeded", summary=f"stopped following {number}", retry="forbidden",
                       effects=[effect(f"watch:{w}", "cancel", "service_ack") for w in answer["stopped"]],
                       values=[value("stopped", len(answer["stopped"]), "watch", SOURCE)], content={"tracking_number": number, "stopped": answer["stopped"]})
    now = track_number(number)
    if now["status"] != "succeeded":
        if now["status"] == "unknown":  # the carrier could not be asked, so nothing was followed (list shows it)
            return receipt("unknown", summary=f"could not ask the carrier about {number}; nothing was followed", unknowns=["state"],
                           retry="after_check", check_with="list", error=(now["error"]["code"], now["error"]["message"]))
        return now
    if now["content"]["arrival"] == "delivered":
        return receipt("failed", summary=f"{number} is already delivered; nothing to follow", retry="forbidden",
                       error=("already_delivered", f"the carrier says {number} is delivered"), content={"parcel": now["content"]})
    body: dict[str, Any] = {"action": "follow", "tracking_number": number, "state": "not_delivered"}
    if label is not None:
        body["label"] = label
    answer = ask(body, "parcel", changes=True)
    if "_receipt" in answer:
        return answer["_receipt"]
    parcel = answer["parcel"]
    if not answer.get("created"):
        return receipt("succeeded", summary=f"{number} is already followed ({now['content']['state']})",
                       effects=[effect(f"watch:{parcel['watch_id']}", "already_following", "service_ack")], content={"parcel": parcel})
    return receipt("succeeded", summary=f"following {number} ({now['content']['state']}): a notice when it is delivered", retry="forbidden",
                   effects=[effect(f"watch:{parcel['watch_id']}", "create", "service_ack")], content={"parcel": parcel})
