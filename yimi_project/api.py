"""The one place where errors become HTTP payloads: ``{"error": {"code", "message"}}``."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import RequestDataTooBig
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler

from yimi_project import jsonbody
from yimi_project.errors import YimiError

_DRF_CODES = {
    drf_exceptions.NotAuthenticated: "not_authenticated",
    drf_exceptions.AuthenticationFailed: "not_authenticated",
    drf_exceptions.PermissionDenied: "forbidden",
    drf_exceptions.NotFound: "not_found",
    drf_exceptions.ParseError: "malformed_json",
    drf_exceptions.Throttled: "rate_limited",
    drf_exceptions.UnsupportedMediaType: "invalid_request",
}


def drf_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, RequestDataTooBig):  # request.body past Django's limit (the signature check reads it)
        exc = jsonbody.too_large()
    if isinstance(exc, YimiError):
        return Response({"error": exc.payload()}, status=exc.http_status)
    response = exception_handler(exc, context)
    if response is None:
        return None
    code = _DRF_CODES.get(type(exc), "invalid_request")
    detail = exc.detail if isinstance(exc, drf_exceptions.APIException) else str(exc)
    message = str(detail) if not isinstance(detail, (dict, list)) else "invalid request"
    response.data = {"error": {"code": code, "message": message}}
    return response
