"""Internal memory endpoints for the ``memory`` pack (loopback + internal token only).

The same views as the owner's API (``memory.views``), acting for the instance's owner
(``accounts.services.get_owner()``) with the actor ``agent``; included under
``internal/memory/`` (``memory.internal_urls``). Errors are ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request

from memory import views
from yimi_project.errors import YimiError
from yimi_project.internal import LoopbackWithInternalToken


class InternalMemoryView(views.MemoryView):
    authentication_classes: list = []
    permission_classes = [LoopbackWithInternalToken]
    actor = "agent"

    def owner_id(self, request: Request) -> int:
        from accounts.services import get_owner

        owner: Any = get_owner()
        if owner is None:
            raise YimiError("no_owner", "this instance has no owner yet (run manage.py yimi_init)")
        return int(owner.pk)


class AssertionsView(InternalMemoryView, views.AssertionsView):
    pass


class AssertionView(InternalMemoryView, views.AssertionView):
    pass


class AssertionHistoryView(InternalMemoryView, views.AssertionHistoryView):
    pass


class ForgetView(InternalMemoryView, views.ForgetView):
    # The gateway's delete gate (consent) decided before the pack was called.
    require_confirm = False


class SpeakingPreferencesView(InternalMemoryView, views.SpeakingPreferencesView):
    pass


class RestorePreferencesView(InternalMemoryView, views.RestorePreferencesView):
    pass


class RecallView(InternalMemoryView, views.RecallView):
    pass
