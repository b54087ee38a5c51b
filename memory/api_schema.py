"""The request and response bodies of the memory and timeline API (``memory.views``) as the
OpenAPI schema shows them (``/api/schema/``). They describe what the services return
(``memory.timeline.entries.serialize_entry``, ``memory.assertions.store`` ``_serialize``/``history``/
``CommitResult``/``ForgetPreview``/``ForgetResult``, ``memory.assertions.preferences.current``,
``memory.recall.RecallResult``, ``memory.short_context``); no view validates with them.
docs/memory.md is the reference for what each field means."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework import serializers

from memory.assertions.store import PREDICATE, REQUEST_ID
from yimi_project.api_schema import PARSE_ERRORS

JSON = serializers.JSONField


def request_id_field(**kwargs: object) -> serializers.RegexField:
    """An idempotency key as ``memory.assertions.store`` checks it (``REQUEST_ID``)."""
    return serializers.RegexField(REQUEST_ID.pattern, max_length=64, **kwargs)  # type: ignore[arg-type]
# Every endpoint here: a signed device request or the owner's session (docs/protocol.md).
AUTH_ERRORS = ("not_authenticated", "request_replayed", "forbidden")
READ_ERRORS = (*AUTH_ERRORS, "invalid_request", "not_found")
WRITE_ERRORS = (*AUTH_ERRORS, *PARSE_ERRORS, "not_found", "conflict", "forgotten", "request_id_reused", "no_owner")
PREFERENCE_ERRORS = (*AUTH_ERRORS, *PARSE_ERRORS, "conflict", "request_id_reused", "preference_rejected", "preference_too_long")


# --- timeline ----------------------------------------------------------------------------------


class TimelineEntryBody(serializers.Serializer):  # type: ignore[type-arg]
    seq = serializers.IntegerField()
    kind = serializers.CharField(help_text="utterance, assistant, notice, …")
    text = serializers.CharField()
    device_id = serializers.UUIDField(allow_null=True)
    scope = serializers.CharField(help_text="owner or guest")
    reply_to_seq = serializers.IntegerField(allow_null=True)
    notice_code = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()


class TimelinePage(serializers.Serializer):  # type: ignore[type-arg]
    after = serializers.IntegerField()
    entries = TimelineEntryBody(many=True)
    next_after = serializers.IntegerField()
    has_more = serializers.BooleanField()


TIMELINE_PARAMETERS = [
    OpenApiParameter("after", OpenApiTypes.INT, description="entries with seq above this (default 0)"),
    OpenApiParameter("limit", OpenApiTypes.INT, description="page size (default 50, at most TIMELINE_PAGE_MAX, 200)"),
]


# --- assertions --------------------------------------------------------------------------------


class DependencyBody(serializers.Serializer):  # type: ignore[type-arg]
    assertion_id = serializers.UUIDField()
    version = serializers.IntegerField()


class AssertionBody(serializers.Serializer):  # type: ignore[type-arg]
    id = serializers.UUIDField()
    predicate = serializers.CharField()
    version = serializers.IntegerField(help_text="the current version")
    state = serializers.ChoiceField(choices=["active", "forgotten"])
    payload = JSON(allow_null=True, help_text="the current version's payload (null once forgotten)")
    evidence = serializers.ListField(child=serializers.IntegerField(), help_text="timeline seq numbers")
    depends_on = DependencyBody(many=True)
    needs_reevaluation = serializers.BooleanField()
    reevaluation_reason = serializers.CharField(allow_null=True)
    updated_at = serializers.DateTimeField()
    forgotten_at = serializers.DateTimeField(allow_null=True)


class AssertionList(serializers.Serializer):  # type: ignore[type-arg]
    assertions = AssertionBody(many=True)


ASSERTION_QUERY_PARAMETERS = [
    OpenApiParameter("predicate", OpenApiTypes.STR, description="exactly this predicate"),
    OpenApiParameter("prefix", OpenApiTypes.STR, description="predicates starting with this"),
    OpenApiParameter("q", OpenApiTypes.STR, description="text in the summary"),
    OpenApiParameter("needs_reevaluation", OpenApiTypes.BOOL),
    OpenApiParameter("include_forgotten", OpenApiTypes.BOOL),
    OpenApiParameter("limit", OpenApiTypes.INT, description="default 50, at most 500"),
]


class CommitBody(serializers.Serializer):  # type: ignore[type-arg]
    assertion_id = serializers.UUIDField(required=False, allow_null=True, help_text="absent or null: a new assertion")
    expected_version = serializers.IntegerField(min_value=0, help_text="the version the writer read; 0 creates")
    predicate = serializers.RegexField(PREDICATE.pattern, max_length=64, help_text="like preference.food")
    payload = JSON()
    evidence = serializers.ListField(child=serializers.IntegerField(), required=False, help_text="timeline seq numbers")
    depends_on = DependencyBody(many=True, required=False)
    request_id = request_id_field(help_text="idempotency key: the same body again is replayed")


class CommitResultBody(serializers.Serializer):  # type: ignore[type-arg]
    assertion_id = serializers.UUIDField()
    version = serializers.IntegerField()
    predicate = serializers.CharField()
    request_id = serializers.CharField()
    committed_at = serializers.DateTimeField()
    marked_for_reevaluation = serializers.ListField(child=serializers.UUIDField())
    replayed = serializers.BooleanField()


class VersionBody(serializers.Serializer):  # type: ignore[type-arg]
    version = serializers.IntegerField()
    payload = JSON(allow_null=True)
    evidence = serializers.ListField(child=serializers.IntegerField())
    erased = serializers.BooleanField()
    depends_on = DependencyBody(many=True)
    actor = serializers.CharField(help_text="owner, agent, …")
    request_id = serializers.CharField()
    committed_at = serializers.DateTimeField()


class DependentBody(serializers.Serializer):  # type: ignore[type-arg]
    assertion_id = serializers.UUIDField()
    version = serializers.IntegerField(help_text="the dependent's current version")
    on_version = serializers.IntegerField(help_text="the version of this assertion it was concluded from")


class AssertionHeader(AssertionBody):
    payload = None  # the history lists the payload of every version instead


class HistoryBody(serializers.Serializer):  # type: ignore[type-arg]
    assertion = AssertionHeader()
    versions = VersionBody(many=True)
    dependents = DependentBody(many=True)


class ForgetPreviewItem(serializers.Serializer):  # type: ignore[type-arg]
    id = serializers.UUIDField()
    predicate = serializers.CharField()
    versions = serializers.IntegerField()
    state = serializers.CharField()
    summary = serializers.CharField()


class ForgetPreviewBody(serializers.Serializer):  # type: ignore[type-arg]
    target = serializers.UUIDField()
    will_forget = ForgetPreviewItem(many=True)
    not_erased = serializers.ListField(child=serializers.CharField())


class ForgetBody(serializers.Serializer):  # type: ignore[type-arg]
    request_id = request_id_field()
    confirm = serializers.BooleanField(help_text="must be true (after reading the GET preview)")


class ForgetResultBody(serializers.Serializer):  # type: ignore[type-arg]
    target = serializers.UUIDField()
    request_id = serializers.CharField()
    forgotten = serializers.ListField(child=serializers.DictField())
    versions_erased = serializers.IntegerField()
    already_forgotten = serializers.BooleanField()
    forgotten_at = serializers.DateTimeField()
    redacted = serializers.DictField(child=serializers.IntegerField(), help_text='"app.place" → rows redacted')
    replayed = serializers.BooleanField()
    assertions_forgotten = serializers.IntegerField()
    erased = serializers.CharField()
    kept = serializers.CharField()
    not_erased = serializers.ListField(child=serializers.CharField())


# --- speaking preferences, recall, short context -----------------------------------------------


class SpeakingPreferencesBody(serializers.Serializer):  # type: ignore[type-arg]
    assertion_id = serializers.UUIDField(allow_null=True)
    version = serializers.IntegerField(help_text="0 when none are set")
    text = serializers.CharField(allow_blank=True)


class SetPreferencesBody(serializers.Serializer):  # type: ignore[type-arg]
    text = serializers.CharField()
    expected_version = serializers.IntegerField(min_value=0)
    request_id = request_id_field()


class RestorePreferencesBody(serializers.Serializer):  # type: ignore[type-arg]
    expected_version = serializers.IntegerField(min_value=1)
    request_id = request_id_field()


class RecallHit(TimelineEntryBody):
    score = serializers.FloatField()
    lists = serializers.ListField(child=serializers.CharField(), help_text="keyword, vector")


class RecallBody(serializers.Serializer):  # type: ignore[type-arg]
    question = serializers.CharField()
    layers = serializers.ListField(child=serializers.ChoiceField(choices=["l3", "timeline", "l5"]))
    assertions = AssertionBody(many=True)
    timeline = RecallHit(many=True)
    unavailable = serializers.DictField(child=serializers.CharField(), help_text="layer → why it gave nothing")
    keyword_backend = serializers.CharField()
    vector_model = serializers.CharField(allow_null=True)


RECALL_PARAMETERS = [
    OpenApiParameter("q", OpenApiTypes.STR, required=True, description="the question (first 500 characters)"),
    OpenApiParameter("layers", OpenApiTypes.STR, description="comma-separated: l3, timeline, l5 (default: chosen from the question)"),
    OpenApiParameter("limit", OpenApiTypes.INT, description="default 10, at most 50"),
]


class ShortContextBody(serializers.Serializer):  # type: ignore[type-arg]
    text = serializers.CharField(allow_blank=True)
    chars = serializers.IntegerField()
    included = serializers.ListField(child=serializers.CharField())
    timed_out = serializers.ListField(child=serializers.CharField())
    failed = serializers.ListField(child=serializers.CharField())
    elapsed_ms = serializers.IntegerField()
