"""Internal memory endpoints for the ``memory`` pack (internal listener + a pack capability).

The same views as the owner's API (``memory.views``), acting for the owner of the call
the pack is executing, with the actor ``agent``; included under ``internal/memory/``
(``memory.internal_urls``). The pack capability (``yimi_project.call_capability``) says
which call that is and what the gateway decided for it, so memory changes from a pack go
through ``decide`` and its consent gate like every other effect. Every request needs a
call of the memory pack that is still executing (``yimi_project.internal.PackCall``: a
call with a recorded result, or another pack that declared ``memory``, gets ``forbidden``)
and acts for that call's owner only:

- reads (query, history, forget preview, preferences, recall) need such a call, whatever
  its category;
- a commit and a speaking-preferences change need a call decided as ``owner_data``, and a
  commit must be on the call's own ``assertion_id`` when the call named one;
- forgetting needs a call decided as ``delete`` (asked on a card unless the owner
  requested it) on the same ``assertion_id``;
- a history search (``history/search/``) needs a call of ``memory__search_history`` and
  counts towards that call's run's lookups (``memory.timeline.history_search``).

Anything else is refused with ``forbidden`` and changes nothing. Errors are
``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

from uuid import UUID

from rest_framework.request import Request
from rest_framework.response import Response

from memory import views
from memory.timeline import history_search
from yimi_project.errors import YimiError
from yimi_project.internal import PackCall, pack_owner, require_call


class InternalMemoryView(views.MemoryView):
    authentication_classes: list = []
    permission_classes = [PackCall]
    platform_api = "memory"
    actor = "agent"

    def owner_id(self, request: Request) -> int:
        return pack_owner(request)


class AssertionsView(InternalMemoryView, views.AssertionsView):
    def post(self, request: Request) -> Response:
        body = request.data if isinstance(request.data, dict) else {}
        require_call(request, ("owner_data",), **({"assertion_id": body["assertion_id"]} if body.get("assertion_id") else {}))
        return super().post(request)


class AssertionView(InternalMemoryView, views.AssertionView):
    pass


class AssertionHistoryView(InternalMemoryView, views.AssertionHistoryView):
    pass


class ForgetView(InternalMemoryView, views.ForgetView):
    # The gateway's delete gate (consent) decided before the pack was called; the
    # capability proves it, so the owner's review step is not asked again.
    require_confirm = False

    def post(self, request: Request, pk: UUID) -> Response:
        require_call(request, ("delete",), assertion_id=pk)
        return super().post(request, pk)


class SpeakingPreferencesView(InternalMemoryView, views.SpeakingPreferencesView):
    def put(self, request: Request) -> Response:
        require_call(request, ("owner_data",))
        return super().put(request)

    post = put


class RestorePreferencesView(InternalMemoryView, views.RestorePreferencesView):
    def post(self, request: Request) -> Response:
        require_call(request, ("owner_data",))
        return super().post(request)


class RecallView(InternalMemoryView, views.RecallView):
    pass


class HistorySearchView(InternalMemoryView):
    """GET ``?q=&after=&before=``: one history lookup of the executing call's run."""

    tool = "memory__search_history"

    def get(self, request: Request) -> Response:
        claims = request.pack_call  # type: ignore[attr-defined]
        if claims.get("tool") != self.tool:
            raise YimiError("forbidden", f"history search answers calls of {self.tool} only")
        result = history_search.lookup(
            self.owner_id(request), request.query_params.get("q", ""),
            after=request.query_params.get("after"), before=request.query_params.get("before"),
            run_key=claims.get("run"), call_key=claims.get("call"),
        )
        return Response(result.payload())
