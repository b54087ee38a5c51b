"""Errors a caller can act on: one exception type with a stable ``code``.

Services raise ``YimiError(code, message)``; the DRF exception handler and the websocket
consumer map it once to their payloads. The codes are part of the protocol
(docs/protocol.md) and never change meaning.
"""

from __future__ import annotations

from typing import Any

HTTP_STATUS = {
    "invalid_request": 400,
    "malformed_json": 400,
    "invalid_code": 400,
    "code_expired": 400,
    "code_used": 400,
    "invalid_public_key": 400,
    "bad_signature": 401,
    "request_replayed": 401,
    "not_authenticated": 401,
    "device_revoked": 403,
    "forbidden": 403,
    "not_found": 404,
    "rate_limited": 429,
    "payload_too_large": 413,
    "conflict": 409,
    "forgotten": 410,
    "request_id_reused": 409,
    "preference_rejected": 422,
    "preference_too_long": 400,
    "nothing_to_restore": 409,
    "confirmation_required": 409,
    "forget_incomplete": 500,
    "stale_revision": 409,
    "reminder_already_fired": 409,
    "no_owner": 409,
    # images (docs/protocol.md "Images")
    "image_too_large": 413,
    "image_unsupported": 415,
    "image_too_many_pixels": 422,
    "image_invalid": 400,
    "image_purged": 410,
    "storage_full": 507,
    # the Mac relay (docs/protocol.md "The Mac relay")
    "paused": 409,
    "mac_offline": 503,
    "mac_timeout": 504,
    # the executor API (phone pack model steps; docs/protocol.md "Internal endpoint for a pack's model steps")
    "executor_model_failed": 502,
    # erasing the timeline (memory.timeline.erasure; docs/protocol.md "Internal endpoints")
    "erasure_changed": 409,
    "erasure_too_large": 422,
    "nothing_to_erase": 409,
    "preview_expired": 410,
    # location (docs/protocol.md "Location and health")
    "no_location": 409,
    "too_many_places": 409,
    "too_many_geofences": 409,
}


class YimiError(Exception):
    def __init__(self, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    def payload(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            body["details"] = self.details
        return body

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 400)
