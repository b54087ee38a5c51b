"""The companion's models move out of the brain app (issue 36), keeping their tables.

State only: the eight models (persona versions, content cards, call snapshots, the privacy
epoch, companion settings, call summaries, topic states, call events) are created in this
app's state with ``db_table`` naming the brain tables they already have, and no database
operation runs; ``brain 0019`` deletes them from the brain's state. Their rows in
``django_content_type`` are renamed to the ``companion`` label, so staff permissions and
admin log entries stay with them. An installed instance upgrades in place; a fresh database
gets the tables from ``brain 0015`` and ``brain 0016``.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from yimi_project.migration_ops import move_content_types

MODELS = (
    "personaversion", "contentcard", "callsnapshot", "privacyepoch", "companionsettings",
    "callsummary", "topicstate", "callevent",
)



class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('accounts', '0004_face_enrollment'),
        ('brain', '0017_watch_verbose_name_plural'),
        ('contenttypes', '0002_remove_content_type_name'),
        ('memory', '0011_cold_packs'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.CreateModel(
                    name='ContentCard',
                    fields=[
                        ('id', models.SlugField(max_length=64, primary_key=True, serialize=False)),
                        ('version', models.PositiveIntegerField(default=1)),
                        ('mode', models.CharField(choices=[('chat', 'Chat'), ('reminiscence', 'Reminiscence'), ('story', 'Story'), ('guess', 'Guess')], max_length=16)),
                        ('title', models.CharField(max_length=80)),
                        ('opening', models.CharField(help_text='the first line, said as it is', max_length=200)),
                        ('followups', models.JSONField(blank=True, default=list)),
                        ('source', models.CharField(blank=True, help_text='blank: told as a story, never as news', max_length=200)),
                        ('tags', models.JSONField(blank=True, default=list)),
                        ('estimated_duration', models.PositiveIntegerField(help_text='seconds')),
                        ('active', models.BooleanField(default=True)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                    ],
                    options={
                        'db_table': 'brain_contentcard',
                        'ordering': ['id'],
                    },
                ),
                migrations.CreateModel(
                    name='CallSummary',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('transcript_version', models.CharField(help_text="digest of the call's entries (ids, kinds, texts)", max_length=32)),
                        ('extractor_version', models.CharField(max_length=16)),
                        ('epoch', models.BigIntegerField(help_text="the owner's privacy epoch the job started and wrote under")),
                        ('text', models.CharField(blank=True, max_length=400)),
                        ('source_entries', models.JSONField(blank=True, default=list)),
                        ('facts', models.JSONField(blank=True, default=dict)),
                        ('stats', models.JSONField(blank=True, default=dict)),
                        ('created_at', models.DateTimeField()),
                        ('invalidated_at', models.DateTimeField(blank=True, null=True)),
                        ('invalidated_reason', models.CharField(blank=True, max_length=64)),
                        ('call', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='summaries', to='accounts.voicecall')),
                        ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='call_summaries', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'verbose_name_plural': 'call summaries',
                        'db_table': 'brain_callsummary',
                    },
                ),
                migrations.CreateModel(
                    name='CompanionSettings',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('continuity_enabled', models.BooleanField(default=True)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                        ('owner', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='companion_settings', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'verbose_name_plural': 'companion settings',
                        'db_table': 'brain_companionsettings',
                    },
                ),
                migrations.CreateModel(
                    name='PersonaVersion',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('version', models.PositiveIntegerField()),
                        ('name', models.CharField(help_text='what she is called; the owner may rename her', max_length=32)),
                        ('identity', models.TextField(help_text='who she is and how she treats the owner', max_length=1200)),
                        ('rhythm', models.TextField(help_text='reply rhythm: short sentences, few easy questions', max_length=1200)),
                        ('fact_boundaries', models.TextField(help_text='what she never invents', max_length=1200)),
                        ('examples', models.JSONField(blank=True, default=list)),
                        ('note', models.CharField(blank=True, help_text='why this version was published', max_length=200)),
                        ('effective', models.BooleanField(default=False)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='persona_versions', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'brain_personaversion',
                        'ordering': ['owner_id', '-version'],
                    },
                ),
                migrations.CreateModel(
                    name='CallSnapshot',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('opening', models.CharField(max_length=200)),
                        ('opening_key', models.CharField(blank=True, help_text='which candidate made the opening', max_length=48)),
                        ('background', models.JSONField(blank=True, default=dict)),
                        ('card_version', models.PositiveIntegerField(blank=True, null=True)),
                        ('card_content', models.JSONField(blank=True, help_text='the card as it was when the call started', null=True)),
                        ('continuity', models.BooleanField(default=True, help_text='continuity was on when the snapshot was built')),
                        ('epoch', models.BigIntegerField(help_text="the owner's privacy epoch the background was read under")),
                        ('built_at', models.DateTimeField()),
                        ('attempts', models.PositiveIntegerField(default=1)),
                        ('fallback', models.BooleanField(default=False)),
                        ('error', models.TextField(blank=True)),
                        ('call', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='snapshot', to='accounts.voicecall')),
                        ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='call_snapshots', to=settings.AUTH_USER_MODEL)),
                        ('card', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='snapshots', to='companion.contentcard')),
                        ('persona_version', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='snapshots', to='companion.personaversion')),
                    ],
                    options={
                        'db_table': 'brain_callsnapshot',
                    },
                ),
                migrations.CreateModel(
                    name='PrivacyEpoch',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('value', models.BigIntegerField(default=0)),
                        ('changed_at', models.DateTimeField(blank=True, null=True)),
                        ('reason', models.CharField(blank=True, max_length=64)),
                        ('owner', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='privacy_epoch', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'brain_privacyepoch',
                    },
                ),
                migrations.CreateModel(
                    name='TopicState',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('topic_key', models.CharField(max_length=64)),
                        ('label', models.CharField(help_text='what a prompt calls the topic', max_length=80)),
                        ('state', models.CharField(choices=[('answered', 'Answered'), ('refused', 'Refused'), ('cooldown', 'Cooldown'), ('done', 'Done')], max_length=16)),
                        ('change', models.CharField(max_length=16)),
                        ('last_question', models.CharField(blank=True, help_text="Yimi's last question on this topic, if any", max_length=300)),
                        ('cooldown_until', models.DateTimeField(blank=True, null=True)),
                        ('quote', models.CharField(max_length=200)),
                        ('extractor_version', models.CharField(max_length=16)),
                        ('epoch', models.BigIntegerField()),
                        ('position', models.PositiveIntegerField(help_text='order of the change inside its call')),
                        ('created_at', models.DateTimeField()),
                        ('invalidated_at', models.DateTimeField(blank=True, null=True)),
                        ('invalidated_reason', models.CharField(blank=True, max_length=64)),
                        ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='topic_states', to=settings.AUTH_USER_MODEL)),
                        ('source_call', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='accounts.voicecall')),
                        ('source_entry', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='memory.timelineentry')),
                        ('summary', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='topics', to='companion.callsummary')),
                    ],
                    options={
                        'db_table': 'brain_topicstate',
                    },
                ),
                migrations.CreateModel(
                    name='CallEvent',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('kind', models.CharField(choices=[('start', 'Start'), ('snapshot_built', 'Snapshot Built'), ('snapshot_failed', 'Snapshot Failed'), ('first_audio', 'First Audio'), ('reconnect', 'Reconnect'), ('barge_in', 'Barge In'), ('end', 'End')], max_length=16)),
                        ('at', models.DateTimeField()),
                        ('data', models.JSONField(blank=True, default=dict)),
                        ('call', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='events', to='accounts.voicecall')),
                        ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'brain_callevent',
                        'indexes': [models.Index(fields=['call', 'kind'], name='call_event_call_kind'), models.Index(fields=['owner', 'at'], name='call_event_owner_at')],
                    },
                ),
                migrations.AddIndex(
                    model_name='callsummary',
                    index=models.Index(condition=models.Q(('invalidated_at', None)), fields=['owner', '-created_at'], name='call_summary_owner_recent'),
                ),
                migrations.AddConstraint(
                    model_name='callsummary',
                    constraint=models.UniqueConstraint(fields=('call', 'transcript_version', 'extractor_version'), name='call_summary_once_per_transcript'),
                ),
                migrations.AddConstraint(
                    model_name='personaversion',
                    constraint=models.UniqueConstraint(fields=('owner', 'version'), name='persona_version_unique'),
                ),
                migrations.AddConstraint(
                    model_name='personaversion',
                    constraint=models.UniqueConstraint(condition=models.Q(('effective', True)), fields=('owner',), name='persona_one_effective_per_owner'),
                ),
                migrations.AddIndex(
                    model_name='callsnapshot',
                    index=models.Index(fields=['owner', '-built_at'], name='call_snapshot_owner_built'),
                ),
                migrations.AddIndex(
                    model_name='topicstate',
                    index=models.Index(condition=models.Q(('invalidated_at', None)), fields=['owner', 'topic_key'], name='topic_state_owner_key'),
                ),
                migrations.AddIndex(
                    model_name='topicstate',
                    index=models.Index(fields=['source_entry'], name='topic_state_source_entry'),
                ),
            ],
        ),
        move_content_types(MODELS, 'brain', 'companion'),
    ]
