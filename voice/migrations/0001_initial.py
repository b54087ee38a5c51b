# VoiceUtterance moved here from the devices app. Its table and rows stay as they are
# (devices_voiceutterance): the model enters voice's state only, and
# devices/migrations/0010_voice_utterance_to_voice.py then takes it out of devices'. Its content
# type (and so its permissions and admin log entries) moves along.

import django.db.models.deletion
import uuid
from django.conf import settings
from django.db import migrations, models

from yimi_project.migration_ops import move_content_types

MODELS = ('voiceutterance',)



class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('accounts', '0003_voice_identity'),
        ('contenttypes', '0002_remove_content_type_name'),
        ('devices', '0009_push_to_talk_holds'),
        ('memory', '0001_initial'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='VoiceUtterance',
                    fields=[
                        ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ('channel', models.CharField(max_length=32)),
                        ('mode', models.CharField(default='normal', max_length=16)),
                        ('started_at', models.DateTimeField(help_text='wall clock of the first voiced sample')),
                        ('stream_start_ms', models.PositiveBigIntegerField()),
                        ('stream_end_ms', models.PositiveBigIntegerField()),
                        ('voiced_ms', models.PositiveIntegerField()),
                        ('quality', models.FloatField()),
                        ('voiceprint_model', models.CharField(blank=True, max_length=160)),
                        ('band', models.CharField(blank=True, help_text='verified, uncertain, unmatched, or empty', max_length=16)),
                        ('score', models.FloatField(blank=True, null=True)),
                        ('scope', models.CharField(max_length=16)),
                        ('reason', models.CharField(max_length=64)),
                        ('disposition', models.CharField(choices=[('ambient', 'Ambient'), ('request', 'Request'), ('echo', 'Echo'), ('enrollment', 'Enrollment')], max_length=16)),
                        ('transcript', models.TextField(blank=True)),
                        ('transcript_source', models.CharField(blank=True, choices=[('', 'None'), ('server_asr', 'Server'), ('device', 'Device')], default='', max_length=16)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('admission', models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='voice_utterance', to='accounts.admissionrecord')),
                        ('call', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='accounts.voicecall')),
                        ('device', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='voice_utterances', to='devices.device')),
                        ('entry', models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='voice_utterance', to='memory.timelineentry')),
                        ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='voice_utterances', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'devices_voiceutterance',
                        'indexes': [models.Index(fields=['owner', 'created_at'], name='devices_voi_owner_i_574f38_idx')],
                    },
                ),
            ],
            database_operations=[],
        ),
        move_content_types(MODELS, 'devices', 'voice'),
    ]
