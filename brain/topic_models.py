"""The voice companion (issue 21, part two): what a call left behind — a short summary and
the progress of each topic — and the events of each call.

Written only by ``brain.topic_state`` (summaries, topic rows, their invalidation) and
``brain.call_events`` (events). Progress only ever cites the owner's own utterances (timeline
entries) and L3 assertion ids and versions; it is never a second store of facts about the
owner: the facts themselves are always read from the current L3 versions.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class CallSummary(models.Model):
    """The end-of-call summary of one call, for one transcript version and one extractor
    version (unique together: the task that writes it is idempotent on them).

    ``text`` is the deterministic digest the extractor wrote (what was talked about, in a
    few words, with the owner's own quotes). ``facts`` names the L3 assertions committed
    from this call's entries ({assertion id: version}); the next call reads their *current*
    versions, so an owner's later edit always wins. ``stats`` are the counts the companion
    report shows (repeated questions, short-reply runs, ...). A summary derived from a
    source that was forgotten, erased or edited is invalidated (``invalidated_at``) at
    once, in the transaction that moves the owner's privacy epoch.
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="call_summaries")
    call = models.ForeignKey("accounts.VoiceCall", on_delete=models.CASCADE, related_name="summaries")
    transcript_version = models.CharField(max_length=32, help_text="digest of the call's entries (ids, kinds, texts)")
    extractor_version = models.CharField(max_length=16)
    epoch = models.BigIntegerField(help_text="the owner's privacy epoch the job started and wrote under")
    text = models.CharField(max_length=400, blank=True)
    # [timeline entry id, ...]: the owner's utterances the summary was read from
    source_entries = models.JSONField(default=list, blank=True)
    facts = models.JSONField(default=dict, blank=True)
    stats = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    invalidated_at = models.DateTimeField(null=True, blank=True)
    invalidated_reason = models.CharField(max_length=64, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["call", "transcript_version", "extractor_version"], name="call_summary_once_per_transcript"
            )
        ]
        indexes = [
            models.Index(fields=["owner", "-created_at"], name="call_summary_owner_recent", condition=Q(invalidated_at=None))
        ]
        verbose_name_plural = "call summaries"

    def __str__(self) -> str:
        return f"summary of call {self.call_id} ({self.extractor_version})"


class TopicState(models.Model):
    """One change of one topic's progress, read from one owner utterance.

    Rows are appended, never edited (except for ``invalidated_at``): the newest valid row of
    a ``topic_key`` is the topic's state, the older ones stay as the reviewable history — a
    corrected detail keeps the statement it corrected. ``source_entry`` is always the
    owner's own utterance (never Yimi's question: that is ``last_question``).
    """

    class State(models.TextChoices):
        ANSWERED = "answered"  # the owner told it: do not ask the same detail again
        REFUSED = "refused"  # the owner said not to talk about it: never raised again until they bring it up
        COOLDOWN = "cooldown"  # short replies in a row: maybe not interesting now; not a refusal
        DONE = "done"  # a story or activity finished: never offered as an unfinished thread

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="topic_states")
    summary = models.ForeignKey(CallSummary, on_delete=models.CASCADE, related_name="topics")
    topic_key = models.CharField(max_length=64)
    label = models.CharField(max_length=80, help_text="what a prompt calls the topic")
    state = models.CharField(max_length=16, choices=State.choices)
    # Why the state changed: answered, correction, reopened, refused, short_replies, finished.
    change = models.CharField(max_length=16)
    last_question = models.CharField(max_length=300, blank=True, help_text="Yimi's last question on this topic, if any")
    cooldown_until = models.DateTimeField(null=True, blank=True)
    source_call = models.ForeignKey("accounts.VoiceCall", on_delete=models.CASCADE, related_name="+")
    source_entry = models.ForeignKey("memory.TimelineEntry", on_delete=models.CASCADE, related_name="+")
    quote = models.CharField(max_length=200)
    extractor_version = models.CharField(max_length=16)
    epoch = models.BigIntegerField()
    position = models.PositiveIntegerField(help_text="order of the change inside its call")
    created_at = models.DateTimeField()
    invalidated_at = models.DateTimeField(null=True, blank=True)
    invalidated_reason = models.CharField(max_length=64, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["owner", "topic_key"], name="topic_state_owner_key", condition=Q(invalidated_at=None)),
            models.Index(fields=["source_entry"], name="topic_state_source_entry"),
        ]

    def __str__(self) -> str:
        return f"{self.topic_key}: {self.state}"


class CallEvent(models.Model):
    """One moment of a call, for the companion report: start, snapshot built (or failed),
    first audio played (the device's ``played``), reconnect, barge-in, end.

    ``at`` is when it happened (taken when the frame arrived), not when the row was
    written: events are buffered and written off the audio path (``brain.call_events``).
    """

    class Kind(models.TextChoices):
        START = "start"
        SNAPSHOT_BUILT = "snapshot_built"
        SNAPSHOT_FAILED = "snapshot_failed"
        FIRST_AUDIO = "first_audio"
        RECONNECT = "reconnect"
        BARGE_IN = "barge_in"
        END = "end"

    call = models.ForeignKey("accounts.VoiceCall", on_delete=models.CASCADE, related_name="events")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    at = models.DateTimeField()
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [models.Index(fields=["call", "kind"], name="call_event_call_kind"), models.Index(fields=["owner", "at"], name="call_event_owner_at")]

    def __str__(self) -> str:
        return f"{self.kind} of call {self.call_id}"
