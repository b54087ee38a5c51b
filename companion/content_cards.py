"""Content cards (issue 21): the only code that writes ``ContentCard``.

About ten cards ship in migration ``brain 0015``; the owner or staff maintain them in the
admin, which calls ``save_card``. A card's ``version`` moves on every change, so a call
snapshot says exactly which card text it started with (it also keeps a copy).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F

from companion.models import ContentCard
from yimi_project.errors import YimiError
from yimi_project.logs import log_event

MAX_FOLLOWUPS = 5
MAX_FOLLOWUP_CHARS = 200
MAX_TAGS = 10
MAX_TAG_CHARS = 20
MAX_DURATION_SECONDS = 1800


def _texts(value: Any, field: str, count: int, chars: int) -> list[str]:
    if value in (None, ""):
        return []
    if not isinstance(value, list) or len(value) > count or not all(isinstance(v, str) and v.strip() and len(v) <= chars for v in value):
        raise YimiError("invalid_card", f"{field}: a list of at most {count} non-empty texts of at most {chars} characters")
    return [v.strip() for v in value]


def validate(card: ContentCard) -> None:
    """``invalid_card`` for a card that cannot be offered as it is; nothing is saved."""
    if not (card.opening or "").strip():
        raise YimiError("invalid_card", "opening: a non-empty line is required")
    if card.mode not in ContentCard.Mode.values:
        raise YimiError("invalid_card", f"mode: one of {', '.join(ContentCard.Mode.values)}")
    if not 1 <= (card.estimated_duration or 0) <= MAX_DURATION_SECONDS:
        raise YimiError("invalid_card", f"estimated_duration: 1-{MAX_DURATION_SECONDS} seconds")
    card.followups = _texts(card.followups, "followups", MAX_FOLLOWUPS, MAX_FOLLOWUP_CHARS)
    card.tags = _texts(card.tags, "tags", MAX_TAGS, MAX_TAG_CHARS)


def save_card(card: ContentCard, *, created: bool) -> ContentCard:
    """Validate and save ``card``; a change moves its version by one (``UPDATE ... SET
    version = version + 1``, so two editors never produce the same version)."""
    validate(card)
    with transaction.atomic():
        if created:
            card.version = 1
            card.save(force_insert=True)
        else:
            card.save(update_fields=[f.name for f in ContentCard._meta.concrete_fields if f.name not in ("id", "version")])
            ContentCard.objects.filter(pk=card.pk).update(version=F("version") + 1)
            card.refresh_from_db(fields=["version"])
    log_event("content_card_saved", card=card.pk, version=card.version)
    return card
