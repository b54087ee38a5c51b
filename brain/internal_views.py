"""Internal endpoints brain answers for packs, on the internal listener, each for a pack
capability: the ``schedule`` pack's reminders, the ``model_settings`` pack's roles and
drafts, and one chat turn for packs that run a model loop (``executor``). They parse and
authorize; reminders, roles and drafts are written by their own modules.

    GET  internal/reminders/?include_done=1      → 200 {"reminders": [...]}
    POST internal/reminders/                     → 201 {"reminder": {...}, "created": true}
         {"text", "due_at", "idempotency_key"?}     (200 and "created": false for a replay)
    POST internal/reminders/<uuid>/cancel/       → 200 {"reminder": {...}}

They act for the owner of the call the pack is executing (its capability, see
``yimi_project.call_capability``): listing needs a capability for a call of the schedule
pack; creating and cancelling need a call the gateway decided as ``owner_data``, and a
cancel must be on the call's own ``reminder_id``. Errors are ``{"error": {"code",
"message"}}`` (``yimi_project.api``).

    GET  internal/model-settings/                → 200 {"roles": [...], "open_drafts": [...]}
    POST internal/model-settings/drafts/         → 201 {"draft": {...}, "created": true}
         {"role", "provider"?, "base_url"?, "model"?, "options"?, "note"?, "idempotency_key"?}

For the ``model_settings`` pack (``platform_api`` ``model_settings``): reading needs a
capability for a call of that pack; drafting a call decided as ``owner_data`` on its own
``role``. Fields left out are the role's current ones. A draft made here is ``yimi``'s:
it carries no provider key (the owner sets keys in the console) and stays open until one
of the owner's devices confirms it (``brain.role_drafts.confirm_draft``) — there is no
endpoint that applies anything.

    POST internal/executor/chat/                 → 200 {"text", "role"}
         {"role"?: "executor_fast" | "executor_thorough", "messages": [{"role", "content"}, ...]}

For packs that run a model loop without holding a model key (the ``phone`` pack's steps;
``platform_api`` ``executor``): one Chat Completions turn with the role's model (default
``executor_fast``), text only (no tools), at most 40 messages and 200,000 characters,
counted in the call's run's usage. Any executing call of such a pack may ask; once the
call has ended only a ``long_running`` tool's capability still may, for the task it
started, until it expires (``capabilities.services.capability_live``). A failed model call
is ``executor_model_failed`` (502); an unusable role ``role_not_configured``.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from asgiref.sync import async_to_sync
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import User
from brain import reminders, role_drafts, roles
from brain.client import BrainError, complete
from brain.usage import CallContext
from yimi_project.errors import YimiError
from yimi_project.internal import PackCall, require_call


def _owner(request: Request) -> Any:
    owner = User.objects.filter(pk=request.pack_call.get("owner")).first()  # type: ignore[attr-defined]
    if owner is None:
        raise YimiError("no_owner", "this call has no owner on this instance (run manage.py yimi_init)")
    return owner


class InternalView(APIView):
    authentication_classes: list = []
    permission_classes = [PackCall]
    platform_api = "reminders"


class RemindersView(InternalView):
    def get(self, request: Request) -> Response:
        include_done = request.query_params.get("include_done", "").lower() in ("1", "true", "yes")
        rows = reminders.list_reminders(_owner(request), include_done=include_done)
        return Response({"reminders": [reminders.serialize_reminder(r) for r in rows]})

    def post(self, request: Request) -> Response:
        data = request.data
        if not isinstance(data, dict):
            raise YimiError("invalid_request", "expected a JSON object")
        require_call(request, ("owner_data",))
        reminder, created = reminders.create_reminder(
            _owner(request), data.get("text"), data.get("due_at"), idempotency_key=data.get("idempotency_key")
        )
        return Response({"reminder": reminders.serialize_reminder(reminder), "created": created}, status=201 if created else 200)


class CancelReminderView(InternalView):
    def post(self, request: Request, pk: UUID) -> Response:
        require_call(request, ("owner_data",), reminder_id=pk)
        reminder = reminders.cancel_reminder(_owner(request), pk)
        return Response({"reminder": reminders.serialize_reminder(reminder)})


class ModelSettingsInternalView(APIView):
    authentication_classes: list = []
    permission_classes = [PackCall]
    platform_api = "model_settings"


class ModelSettingsView(ModelSettingsInternalView):
    def get(self, request: Request) -> Response:
        return Response(role_drafts.read_settings())


DRAFT_FIELDS = ("role", "provider", "base_url", "model", "options", "note", "idempotency_key")


class ModelDraftsView(ModelSettingsInternalView):
    def post(self, request: Request) -> Response:
        data = request.data
        if not isinstance(data, dict):
            raise YimiError("invalid_request", "expected a JSON object")
        extra = sorted(set(data) - set(DRAFT_FIELDS))
        if extra:
            raise YimiError("invalid_request", f"a draft from Yimi takes only {', '.join(DRAFT_FIELDS)}; not {', '.join(extra)} "
                            "(provider keys are set by the owner in the console)")
        role = data.get("role")
        if not isinstance(role, str):
            raise YimiError("invalid_request", "role is required")
        require_call(request, ("owner_data",), role=role)
        current = role_drafts.current_settings(role) if role in role_drafts.roles.ROLES else {}
        options = data.get("options")
        if options is not None and not isinstance(options, dict):
            raise YimiError("invalid_model_settings", "options must be an object")
        draft, created = role_drafts.create_draft(
            role, provider=data.get("provider", current.get("provider", "")), base_url=data.get("base_url", current.get("base_url", "")),
            model=data.get("model", current.get("model", "")), options={**current.get("options", {}), **(options or {})},
            created_by="yimi", note=data.get("note", ""), idempotency_key=data.get("idempotency_key"),
        )
        if created:
            role_drafts.dispatch_probe(draft.id)
        return Response({"draft": role_drafts.serialize_draft(draft), "created": created}, status=201 if created else 200)


EXECUTOR_ROLES = ("executor_fast", "executor_thorough")
EXECUTOR_MAX_MESSAGES, EXECUTOR_MAX_CHARS = 40, 200_000


class ExecutorChatView(APIView):
    authentication_classes: list = []
    permission_classes = [PackCall]
    platform_api = "executor"

    def post(self, request: Request) -> Response:
        data = request.data
        if not isinstance(data, dict):
            raise YimiError("invalid_request", "expected a JSON object")
        role = data.get("role", "executor_fast")
        if role not in EXECUTOR_ROLES:
            raise YimiError("invalid_request", f"role must be one of {', '.join(EXECUTOR_ROLES)}")
        messages = data.get("messages")
        if (
            not isinstance(messages, list) or not 0 < len(messages) <= EXECUTOR_MAX_MESSAGES
            or not all(isinstance(m, dict) and m.get("role") in ("system", "user", "assistant") and isinstance(m.get("content"), str) for m in messages)
        ):
            raise YimiError("invalid_request", f"messages: 1 to {EXECUTOR_MAX_MESSAGES} of {{role: system|user|assistant, content: text}}")
        if sum(len(m["content"]) for m in messages) > EXECUTOR_MAX_CHARS:
            raise YimiError("payload_too_large", f"the messages are longer than {EXECUTOR_MAX_CHARS} characters")
        role_settings = roles.resolve(role)
        run_id = request.pack_call.get("run")  # type: ignore[attr-defined]
        try:
            run_id = UUID(str(run_id))
        except ValueError:
            run_id = None
        clean = [{"role": m["role"], "content": m["content"]} for m in messages]
        try:
            completion = async_to_sync(complete)(clean, role_settings=role_settings, usage_for=CallContext(run_id))
        except BrainError as exc:
            raise YimiError("executor_model_failed", f"the {role} model did not answer ({exc.code})") from None
        return Response({"text": completion.text, "role": role})
