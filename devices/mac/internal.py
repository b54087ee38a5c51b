"""``POST /internal/mac/op/``: the ``owner-mac`` and ``desktop`` packs' one way to the owner's Mac.

Internal listener + a pack capability of a call still executing, whose pack declared the
``mac`` platform API and is one the API serves (``owner-mac``, ``desktop``), exactly as
memory's endpoints (yimi_project.internal.pack_call_claims). The body is
``{"kind": "<op>", "payload": {...}}``; the answer ``{"result": {...}}`` is the Mac's
decrypted result (devices/mac/relay.py). What the capability allows:

- the operation is the call's own tool: a call of ``<pack>__read_file`` reads a file and
  does nothing else; and it is one of that pack's operations (``mac_relay.PACK_KINDS``:
  owner-mac's six file/command/app kinds, desktop's sixteen desktop kinds; any other pack
  that declared the API gets none);
- reads (``read_file``, ``list_dir``, ``screenshot``, desktop's ``list_windows``,
  ``read_clipboard``...) need a call decided as ``observe`` or ``owner_data``; writes,
  commands and desktop acts (``write_file``, ``run_command``, ``operate_app``,
  ``type_text``, ``click``...) a call decided as ``owner_data`` (asked on a card when the
  owner did not request it);
- the operation is on the call's target (its ``path``, ``app``, ``url``) when the call named one.

Errors are ``{"error": {"code", "message"}}``: ``forbidden`` (403), ``invalid_request``,
``paused`` (409), ``mac_offline`` (503), ``mac_timeout`` (504); none changes anything on the
Mac except ``mac_timeout``, whose outcome is unknown.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from devices.mac import relay as mac_relay
from yimi_project import jsonbody
from yimi_project.errors import YimiError
from yimi_project.internal import call_owner, error_response, live_pack_call_claims

API = "mac"


def check_call(claims: dict[str, Any], kind: str, payload: dict[str, Any]) -> None:
    """Refuse (``forbidden``) an operation the executing call does not allow."""
    tool = str(claims.get("tool", ""))
    pack, _, tool_name = tool.partition("__")
    if tool_name != kind or pack != claims.get("pack"):
        raise YimiError("forbidden", f"this call is {tool!r}; it may not do {kind}")
    if kind not in mac_relay.PACK_KINDS.get(pack, ()):
        raise YimiError("forbidden", f"the {pack!r} pack does not do {kind} on the Mac")
    category = claims.get("category")
    allowed = ("observe", "owner_data") if kind in mac_relay.READ_KINDS else ("owner_data",)
    if category not in allowed:
        raise YimiError("forbidden", f"this call was decided as {category!r}; {kind} needs {' or '.join(allowed)}")
    named = claims.get("target") or {}
    for field, value in named.items():  # every target the call was decided on (argv, keys, volume, ...)
        if str(value) != str(payload.get(field)):
            raise YimiError("forbidden", f"this call is about {field} {value!r}, not {payload.get(field)!r}")


@csrf_exempt
async def mac_op(request: HttpRequest) -> JsonResponse:
    try:
        claims = await live_pack_call_claims(request, API)
        if claims is None:
            raise YimiError("forbidden", "this endpoint answers a pack only while it executes a call that declared the mac API")
        if request.method != "POST":
            raise YimiError("invalid_request", "use POST")
        body = jsonbody.parse(jsonbody.request_body(request))
        kind, payload = (body.get("kind"), body.get("payload")) if isinstance(body, dict) else (None, None)
        if kind not in mac_relay.KINDS or not isinstance(payload, dict):
            raise YimiError("invalid_request", f"expected {{kind: one of {', '.join(mac_relay.KINDS)}, payload: {{...}}}}")
        owner = call_owner(claims)
        check_call(claims, kind, payload)
        result = await mac_relay.relay(owner, kind, payload, call_id=str(claims.get("call", "")), tool=str(claims.get("tool", "")))
    except YimiError as exc:
        return error_response(exc)
    return JsonResponse({"result": result})
