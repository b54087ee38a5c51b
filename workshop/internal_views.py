"""Internal endpoint of the ``workshop`` pack (``platform_api`` ``workshop``), on the internal
listener with the pack capability of the call being executed (``yimi_project.internal``):

- ``POST workshop/`` ``{"action": "find", "query"}`` → ``capability_find``'s result;
- ``{"action": "build", "spec"}`` → ``{"build": {...}}``: a build recorded and started
  (``workshop.builds.start_build``); only for a ``workshop__build`` call the gateway
  decided as ``workspace``;
- ``{"action": "builds", "build_id"?}`` → ``{"builds": [...]}``: the recent builds (or one),
  each with ``published``: the version it put online and whether it still is
  (``workshop.builds.published_version``);
- ``{"action": "revert", "name", "digest"?}`` → ``{"revert": {pack, reverted, online,
  removed}}``: a Yimi-built pack back to its previous version, a first version removed
  (``workshop.revert``); only for a ``workshop__pack_revert`` call the gateway decided as
  ``owner_data`` on that pack.

Errors are ``{"error": {"code", "message"}}`` (``invalid_request``, ``invalid_spec``,
``wrapper_too_long``, ``reuse_not_found``, ``not_found``, ``forbidden``, ``not_yimi_built``,
``nothing_to_revert``, ``online_version_changed``) and change nothing.
"""

from __future__ import annotations

import uuid
from typing import Any

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from workshop.builds import published_version, start_build
from workshop.find import capability_find
from workshop.models import WorkshopBuild
from workshop.revert import revert_built_pack
from yimi_project.errors import YimiError
from yimi_project.internal import PackCall, json_object, pack_owner, require_call

RECENT_BUILDS = 10


def build_payload(build: WorkshopBuild) -> dict[str, Any]:
    return {
        "id": str(build.id), "name": str(build.spec.get("name") or ""), "state": build.state, "attempts": build.attempts,
        "max_attempts": build.max_attempts, "error_code": build.error_code, "error_message": build.error_message,
        "candidate_digest": build.candidate_digest, "candidate_state": build.candidate_state,
        "log_tail": build.log_tail[-1500:], "created_at": build.created_at.isoformat(), "published": published_version(build),
    }


class WorkshopView(APIView):
    authentication_classes: list = []
    permission_classes = [PackCall]
    platform_api = "workshop"

    def post(self, request: Request) -> Response:
        pack_owner(request)
        body = json_object(request)
        action = body.get("action")
        if action == "find":
            return Response(capability_find(body.get("query")))  # type: ignore[arg-type]
        if action == "build":
            require_call(request, ("workspace",), tools=("workshop__build",))
            return Response({"build": build_payload(start_build(body.get("spec")))})  # type: ignore[arg-type]
        if action == "builds":
            wanted = body.get("build_id")
            if wanted is None:
                return Response({"builds": [build_payload(b) for b in WorkshopBuild.objects.all()[:RECENT_BUILDS]]})
            try:
                build = WorkshopBuild.objects.get(id=uuid.UUID(str(wanted)))
            except (ValueError, WorkshopBuild.DoesNotExist):
                raise YimiError("not_found", f"no build {wanted}") from None
            return Response({"builds": [build_payload(build)]})
        if action == "revert":
            require_call(request, ("owner_data",), tools=("workshop__pack_revert",), name=body.get("name"))
            return Response({"revert": revert_built_pack(body.get("name"), digest=body.get("digest"))})
        raise YimiError("invalid_request", "action is find, build, builds or revert")
