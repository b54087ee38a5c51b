"""What the OpenAPI schema (``/api/schema/``) says every failure looks like: the body
``yimi_project.api.drf_exception_handler`` writes, ``{"error": {"code", "message",
"details"?}}``, and which codes an endpoint answers with each HTTP status. The codes and
their statuses are ``yimi_project.errors.HTTP_STATUS``; docs/protocol.md and docs/memory.md
say when each is given.

The serializers here describe bodies for the schema only; no view validates with them (the
services parse their input and raise ``YimiError``)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers

from yimi_project.errors import HTTP_STATUS

# Answered by DRF before a view runs (yimi_project.api._DRF_CODES), for any endpoint.
PARSE_ERRORS = ("malformed_json", "invalid_request")


class ErrorDetail(serializers.Serializer):  # type: ignore[type-arg]
    code = serializers.CharField(help_text="stable error code (docs/protocol.md); never changes meaning")
    message = serializers.CharField(help_text="for a human; may change")
    details = serializers.DictField(required=False, help_text="only some codes: e.g. conflict's current_version")


class ErrorBody(serializers.Serializer):  # type: ignore[type-arg]
    error = ErrorDetail()


def error_responses(*codes: str) -> dict[int, OpenApiResponse]:
    """``{status: OpenApiResponse(ErrorBody)}`` for ``codes``, grouped by their HTTP status,
    each status listing its codes. An unknown code is a programming error."""
    by_status: dict[int, list[str]] = {}
    for code in codes:
        if code not in HTTP_STATUS:
            raise KeyError(f"{code!r} is not an error code in yimi_project.errors.HTTP_STATUS")
        by_status.setdefault(HTTP_STATUS[code], []).append(code)
    return {
        status: OpenApiResponse(ErrorBody, description="error code: " + " | ".join(f"`{c}`" for c in found))
        for status, found in sorted(by_status.items())
    }


def responses(ok: dict[int, Any], *codes: str) -> dict[int, Any]:
    """The success bodies of an operation together with its error bodies."""
    return {**ok, **error_responses(*codes)}
