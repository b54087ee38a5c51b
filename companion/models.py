"""The voice companion's tables (issue 21): persona versions, content cards, the frozen
snapshot of each call, the owner's privacy epoch and the continuity switch (part one);
what a call left behind — a short summary and the progress of each topic — and the events
of each call (part two).

Written only by ``companion.persona`` (persona versions), ``companion.content_cards``
(cards), ``companion.snapshot`` (snapshots), ``companion.privacy_epoch`` (epoch and
settings), ``companion.topics`` (summaries, topic rows, their invalidation) and
``companion.events`` (events); the admin calls those services. Progress only ever cites the
owner's own utterances (timeline entries) and L3 assertion ids and versions; it is never a
second store of facts about the owner: the facts themselves are always read from the
current L3 versions.

These models lived in the ``brain`` app until issue 36; each keeps its table
(``db_table``, the ``brain_`` name) so an installed instance upgrades in place
(``companion/migrations/0001_initial.py``).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class PersonaVersion(models.Model):
    """One published version of the companion's persona for one owner.

    Never edited after it is published: a change (a new name included) is a new version.
    Exactly one version per owner is ``effective`` (a partial unique index); a call keeps
    the version its snapshot froze, so publishing never changes a call in progress.
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="persona_versions")
    version = models.PositiveIntegerField()
    name = models.CharField(max_length=32, help_text="what she is called; the owner may rename her")
    identity = models.TextField(max_length=1200, help_text="who she is and how she treats the owner")
    rhythm = models.TextField(max_length=1200, help_text="reply rhythm: short sentences, few easy questions")
    fact_boundaries = models.TextField(max_length=1200, help_text="what she never invents")
    # [{"owner": "...", "reply": "..."}]: a few short example exchanges
    examples = models.JSONField(default=list, blank=True)
    note = models.CharField(max_length=200, blank=True, help_text="why this version was published")
    effective = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "brain_personaversion"
        constraints = [
            models.UniqueConstraint(fields=["owner", "version"], name="persona_version_unique"),
            models.UniqueConstraint(fields=["owner"], condition=Q(effective=True), name="persona_one_effective_per_owner"),
        ]
        ordering = ["owner_id", "-version"]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}{' (effective)' if self.effective else ''}"


class ContentCard(models.Model):
    """A small, reviewable piece of content a call may offer (at most one per call).

    ``version`` moves on every change made through the admin; a snapshot copies the card
    as it was. A story with a blank ``source`` is told as a story, never as news.
    """

    class Mode(models.TextChoices):
        CHAT = "chat"
        REMINISCENCE = "reminiscence"
        STORY = "story"
        GUESS = "guess"

    id = models.SlugField(primary_key=True, max_length=64)
    version = models.PositiveIntegerField(default=1)
    mode = models.CharField(max_length=16, choices=Mode.choices)
    title = models.CharField(max_length=80)
    opening = models.CharField(max_length=200, help_text="the first line, said as it is")
    # ["...", ...]: the next small steps, one at a time, only if the owner wants more
    followups = models.JSONField(default=list, blank=True)
    source = models.CharField(max_length=200, blank=True, help_text="blank: told as a story, never as news")
    # interests this card suits (matched against the owner's authorized interests); empty: any owner
    tags = models.JSONField(default=list, blank=True)
    estimated_duration = models.PositiveIntegerField(help_text="seconds")
    active = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "brain_contentcard"
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.id} v{self.version} ({self.mode})"


class CallSnapshot(models.Model):
    """What one call was started with, frozen at ``call.start``: the persona version, the
    opening line, the background and at most one content card.

    One row per call (``call`` is unique). A retried start of the same call reuses it,
    unless the owner's privacy epoch moved since (``epoch`` older) or it is a fallback
    (``fallback``: it could not be built; ``error`` says why), which are built again.
    """

    call = models.OneToOneField("accounts.VoiceCall", on_delete=models.CASCADE, related_name="snapshot")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="call_snapshots")
    persona_version = models.ForeignKey(PersonaVersion, on_delete=models.PROTECT, related_name="snapshots")
    opening = models.CharField(max_length=200)
    opening_key = models.CharField(max_length=48, blank=True, help_text="which candidate made the opening")
    # {"address", "interests": [...], "latest_summary", "resume_thread", "avoid_topics": [...],
    #  "sources": [...]}: the data sections of this call's prompt (companion.snapshot)
    background = models.JSONField(default=dict, blank=True)
    card = models.ForeignKey(ContentCard, null=True, blank=True, on_delete=models.SET_NULL, related_name="snapshots")
    card_version = models.PositiveIntegerField(null=True, blank=True)
    card_content = models.JSONField(null=True, blank=True, help_text="the card as it was when the call started")
    continuity = models.BooleanField(default=True, help_text="continuity was on when the snapshot was built")
    epoch = models.BigIntegerField(help_text="the owner's privacy epoch the background was read under")
    built_at = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=1)
    fallback = models.BooleanField(default=False)
    error = models.TextField(blank=True)

    class Meta:
        db_table = "brain_callsnapshot"
        indexes = [models.Index(fields=["owner", "-built_at"], name="call_snapshot_owner_built")]

    def __str__(self) -> str:
        return f"snapshot of call {self.call_id}{' (fallback)' if self.fallback else ''}"


class PrivacyEpoch(models.Model):
    """The owner's privacy epoch: moves (never back) when a memory source is forgotten,
    edited or withdrawn and when continuity is turned off. Anything derived under an
    older value (a snapshot, a summary, a topic row, an asynchronous job's result) is
    invalid at once."""

    owner = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="privacy_epoch")
    value = models.BigIntegerField(default=0)
    changed_at = models.DateTimeField(null=True, blank=True)
    reason = models.CharField(max_length=64, blank=True)

    class Meta:
        db_table = "brain_privacyepoch"

    def __str__(self) -> str:
        return f"epoch {self.value} ({self.reason or '-'})"


class CompanionSettings(models.Model):
    """Per-owner switches of the companion. Without continuity a call gets the persona and
    an opening, but no summary, thread to resume or interests from memory."""

    owner = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="companion_settings")
    continuity_enabled = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "brain_companionsettings"
        verbose_name_plural = "companion settings"

    def __str__(self) -> str:
        return f"continuity {'on' if self.continuity_enabled else 'off'}"


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
        db_table = "brain_callsummary"
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
        db_table = "brain_topicstate"
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
    written: events are buffered and written off the audio path (``companion.events``).
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
        db_table = "brain_callevent"
        indexes = [models.Index(fields=["call", "kind"], name="call_event_call_kind"), models.Index(fields=["owner", "at"], name="call_event_owner_at")]

    def __str__(self) -> str:
        return f"{self.kind} of call {self.call_id}"
