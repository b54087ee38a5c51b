"""The owner's profile for the ``personal`` pack (``platform_api`` ``profile``): ``GET
/internal/profile/`` answers the body of memory's ``USER.md`` projection
(``memory.assertions.projections.core_profile``) and its sections, for the owner of the call being
executed, to any executing call of the ``personal`` pack (the only pack the API serves,
``yimi_project.internal.API_PACKS``). Read only: the profile changes
through memory (``memory__commit`` of ``core_profile.entry`` with ``doc: user``)."""

from __future__ import annotations

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from memory.assertions import projections
from yimi_project.internal import PackCall, pack_owner


class ProfileView(APIView):
    authentication_classes: list = []
    permission_classes = [PackCall]
    platform_api = "profile"

    def get(self, request: Request) -> Response:
        text = projections.body(projections.core_profile(pack_owner(request)).user)
        sections = [s.strip() for s in text.split(f"\n{projections.SECTION}\n") if s.strip()]
        return Response({"text": text, "sections": sections})
