"""The companion's models moved from the brain app to ``companion`` (issue 36) without
touching their tables: an installed instance upgrades in place.

A fresh database (a PostgreSQL database of its own, or a SQLite file) is migrated to the
migrations from before the move (brain 0017), rows are written with the historical models
there, including a staff permission on a moved model; then every migration runs. The rows
read back through ``companion.models``, the content types carry the ``companion`` label (the
permission follows), and nothing is left to migrate. It runs in a process of its own with
production settings, so the test database is never migrated back and forth.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command

ROOT = Path(__file__).resolve().parents[2]
BEFORE_MOVE = ("brain", "0017_watch_verbose_name_plural")  # the brain's last migration that had the models

SCRIPT = r"""
import json
import sys

import django

django.setup()

from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

before = [tuple(sys.argv[1].split(":")), ("contenttypes", "0002_remove_content_type_name")]
executor = MigrationExecutor(connection)
before.append(executor.loader.graph.leaf_nodes("auth")[0])
executor.migrate(before)
old = executor.loader.project_state(before).apps
now = timezone.now()

ContentType, Permission = old.get_model("contenttypes", "ContentType"), old.get_model("auth", "Permission")
owner = old.get_model("accounts", "User").objects.create(username="owner", password="!", is_owner=True)
device = old.get_model("devices", "Device").objects.create(owner=owner, name="phone", kind="phone", public_key="k" * 43)
call = old.get_model("accounts", "VoiceCall").objects.create(owner=owner, device=device, call_id="c1", channel="phone_app")
Persona = old.get_model("brain", "PersonaVersion")
persona = Persona.objects.create(owner=owner, version=1, name="小禾", identity="i", rhythm="r", fact_boundaries="f", effective=True)
card = old.get_model("brain", "ContentCard").objects.get(id="chat-tea")  # shipped by brain 0015
old.get_model("brain", "CallSnapshot").objects.create(
    call=call, owner=owner, persona_version=persona, opening="您好", card=card, card_version=card.version, epoch=2, built_at=now)
old.get_model("brain", "PrivacyEpoch").objects.create(owner=owner, value=2, reason="continuity_off")
old.get_model("brain", "CompanionSettings").objects.create(owner=owner, continuity_enabled=False)
entry = old.get_model("memory", "TimelineEntry").objects.create(owner=owner, seq=1, kind="utterance", text="车床")
summary = old.get_model("brain", "CallSummary").objects.create(
    owner=owner, call=call, transcript_version="t1", extractor_version="rules-1", epoch=2, text="聊了修车床", created_at=now)
old.get_model("brain", "TopicState").objects.create(
    owner=owner, summary=summary, topic_key="craft.lathe", label="修车床", state="answered", change="answered", source_call=call,
    source_entry=entry, quote="车床", extractor_version="rules-1", epoch=2, position=0, created_at=now)
old.get_model("brain", "CallEvent").objects.create(call=call, owner=owner, kind="start", at=now)
for model in ("personaversion", "contentcard", "callsnapshot", "privacyepoch", "companionsettings", "callsummary", "topicstate", "callevent"):
    ContentType.objects.get_or_create(app_label="brain", model=model)
Permission.objects.create(
    name="Can change persona version", codename="change_personaversion",
    content_type=ContentType.objects.get(app_label="brain", model="personaversion"))

executor = MigrationExecutor(connection)
executor.migrate(executor.loader.graph.leaf_nodes())

from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType

from companion.models import CallEvent, CallSnapshot, CallSummary, CompanionSettings, ContentCard, PersonaVersion, PrivacyEpoch, TopicState

snapshot = CallSnapshot.objects.select_related("persona_version", "card").get()
topic = TopicState.objects.select_related("summary").get()
print(json.dumps({
    "persona": [snapshot.persona_version.name, PersonaVersion.objects.get().effective],
    "snapshot": [snapshot.opening, snapshot.card.id, snapshot.epoch],
    "epoch": PrivacyEpoch.objects.get().value,
    "continuity": CompanionSettings.objects.get().continuity_enabled,
    "topic": [topic.topic_key, topic.summary.text, topic.source_entry_id == entry.id],
    "events": list(CallEvent.objects.values_list("kind", flat=True)),
    "cards": ContentCard.objects.count(),
    "summaries": CallSummary.objects.count(),
    "content_types": sorted(ContentType.objects.filter(model__in=[
        "personaversion", "contentcard", "callsnapshot", "privacyepoch", "companionsettings", "callsummary", "topicstate",
        "callevent"]).values_list("app_label", flat=True).distinct()),
    "permission": Permission.objects.get(codename="change_personaversion").content_type.app_label,
    "unapplied": len((after := MigrationExecutor(connection)).migration_plan(after.loader.graph.leaf_nodes())),
}, ensure_ascii=False))
"""


@pytest.fixture
def fresh_database_url(tmp_path: Path) -> Iterator[str]:
    """A database nobody migrated yet: of its own on the PostgreSQL server the tests use, or a
    SQLite file."""
    db = settings.DATABASES["default"]
    if "postgresql" not in db["ENGINE"]:
        yield f"sqlite:///{tmp_path / 'fresh.sqlite3'}"
        return
    name = f"{db['NAME']}_migration_{uuid.uuid4().hex[:8]}"
    server = f"postgres://{db['USER'] or ''}{':' + db['PASSWORD'] if db.get('PASSWORD') else ''}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server}/{name}"
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_an_installed_instance_keeps_its_companion_rows_when_the_models_move_to_the_companion_app(
    fresh_database_url: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PGOPTIONS")}
    env.update(DJANGO_SETTINGS_MODULE="yimi_project.settings", DATABASE_URL=fresh_database_url, YIMI_DATA_DIR=str(tmp_path / "data"))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, ":".join(BEFORE_MOVE)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {
        "persona": ["小禾", True],
        "snapshot": ["您好", "chat-tea", 2],
        "epoch": 2,
        "continuity": False,
        "topic": ["craft.lathe", "聊了修车床", True],
        "events": ["start"],
        "cards": 10,
        "summaries": 1,
        "content_types": ["companion"],
        "permission": "companion",
        "unapplied": 0,
    }


@pytest.mark.django_db
def test_the_models_match_their_migrations() -> None:
    """``makemigrations --check``: the state-only move left nothing for Django to migrate."""
    call_command("makemigrations", "--check", "--dry-run", stdout=io.StringIO())
