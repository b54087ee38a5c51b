# The model roles, their revisions, drafts, model usage, and the local model catalog's
# selections and signed switches moved here from the brain app (issue 36: the model client
# and its settings are the llm app). Their tables stay as they are (brain_modelrole,
# brain_modelrolerevision, brain_modelsettingsimport, brain_modelroledraft, brain_modelusage,
# devices_modelselection, devices_modelswitch: db_table): the models enter llm's state only,
# and brain/migrations/0018_model_settings_move_to_llm.py takes them out of brain's. Their
# content types (and so their permissions and admin log entries) move along.

import django.db.models.deletion
import django.utils.timezone
import uuid
from django.db import migrations, models

from yimi_project.migration_ops import move_content_types

MODELS = (
    'modelrole', 'modelrolerevision', 'modelsettingsimport', 'modelroledraft', 'modelusage',
    'modelselection', 'modelswitch',
)



class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('brain', '0017_watch_verbose_name_plural'),
        ('contenttypes', '0002_remove_content_type_name'),
        ('devices', '0009_push_to_talk_holds'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='ModelRoleDraft',
                    fields=[
                        ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ('role', models.CharField(choices=[('brain', 'brain'), ('delegation', 'delegation'), ('vision', 'vision'), ('executor_fast', 'executor_fast'), ('executor_thorough', 'executor_thorough'), ('realtime', 'realtime'), ('tts', 'tts'), ('asr_remote', 'asr_remote'), ('workshop_repair', 'workshop_repair')], max_length=24)),
                        ('provider', models.CharField(max_length=64)),
                        ('base_url', models.CharField(max_length=500)),
                        ('model', models.CharField(max_length=200)),
                        ('options', models.JSONField(blank=True, default=dict, help_text='validated, defaults filled in (llm.roles.validate_options)')),
                        ('key_change', models.CharField(choices=[('unchanged', 'Unchanged'), ('new key', 'New')], default='unchanged', max_length=16)),
                        ('api_key_encrypted', models.TextField(blank=True, null=True)),
                        ('digest', models.CharField(help_text='sha256 of the canonical proposed settings (role_drafts.draft_digest)', max_length=64)),
                        ('created_by', models.CharField(choices=[('owner_console', 'Owner Console'), ('yimi', 'Yimi')], max_length=16)),
                        ('note', models.CharField(blank=True, max_length=300)),
                        ('idempotency_key', models.CharField(blank=True, max_length=64, null=True, unique=True)),
                        ('base_version', models.PositiveIntegerField(default=0)),
                        ('state', models.CharField(choices=[('open', 'Open'), ('confirmed', 'Confirmed'), ('discarded', 'Discarded'), ('stale', 'Stale')], db_index=True, default='open', max_length=16)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('closed_at', models.DateTimeField(blank=True, null=True)),
                        ('probe_status', models.CharField(choices=[('pending', 'Pending'), ('ok', 'Ok'), ('failed', 'Failed'), ('unsupported', 'Unsupported')], default='pending', max_length=16)),
                        ('probe_error_code', models.CharField(blank=True, max_length=48)),
                        ('probe_message', models.CharField(blank=True, max_length=300)),
                        ('probe_http_status', models.PositiveSmallIntegerField(blank=True, null=True)),
                        ('probe_latency_ms', models.PositiveIntegerField(blank=True, null=True)),
                        ('probed_at', models.DateTimeField(blank=True, null=True)),
                        ('confirmed_device_id', models.UUIDField(blank=True, null=True)),
                        ('confirm_nonce', models.CharField(blank=True, max_length=64, null=True, unique=True)),
                        ('confirm_issued_at', models.DateTimeField(blank=True, null=True)),
                        ('confirm_message', models.TextField(blank=True)),
                        ('confirm_signature', models.TextField(blank=True)),
                        ('attestation', models.JSONField(blank=True, null=True)),
                        ('applied_version', models.PositiveIntegerField(blank=True, null=True)),
                    ],
                    options={
                        'db_table': 'brain_modelroledraft',
                        'ordering': ('-created_at',),
                    },
                ),
                migrations.CreateModel(
                    name='ModelSelection',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('kind', models.CharField(max_length=16, unique=True)),
                        ('selected_id', models.CharField(blank=True, max_length=80)),
                        ('selected_version', models.CharField(blank=True, max_length=64)),
                        ('effective_id', models.CharField(blank=True, max_length=80)),
                        ('effective_version', models.CharField(blank=True, max_length=64)),
                        ('previous_id', models.CharField(blank=True, max_length=80)),
                        ('previous_version', models.CharField(blank=True, max_length=64)),
                        ('state', models.CharField(choices=[('none', 'None'), ('effective', 'Effective'), ('pending_restart', 'Pending Restart'), ('needs_enrollment', 'Needs Enrollment'), ('rebuilding', 'Rebuilding'), ('failed', 'Failed'), ('listed', 'Listed')], default='none', max_length=24)),
                        ('progress_done', models.PositiveIntegerField(default=0)),
                        ('progress_total', models.PositiveIntegerField(default=0)),
                        ('error_code', models.CharField(blank=True, max_length=48)),
                        ('error_message', models.CharField(blank=True, max_length=500)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                    ],
                    options={
                        'db_table': 'devices_modelselection',
                    },
                ),
                migrations.CreateModel(
                    name='ModelSettingsImport',
                    fields=[
                        ('id', models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
                        ('imported_at', models.DateTimeField()),
                        ('roles', models.JSONField(default=list, help_text='the roles the environment configured')),
                    ],
                    options={
                        'db_table': 'brain_modelsettingsimport',
                    },
                ),
                migrations.CreateModel(
                    name='ModelRole',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('role', models.CharField(choices=[('brain', 'brain'), ('delegation', 'delegation'), ('vision', 'vision'), ('executor_fast', 'executor_fast'), ('executor_thorough', 'executor_thorough'), ('realtime', 'realtime'), ('tts', 'tts'), ('asr_remote', 'asr_remote'), ('workshop_repair', 'workshop_repair')], max_length=24)),
                        ('provider', models.CharField(max_length=64)),
                        ('base_url', models.CharField(max_length=500)),
                        ('model', models.CharField(max_length=200)),
                        ('options', models.JSONField(blank=True, default=dict)),
                        ('api_key_encrypted', models.TextField(blank=True, null=True)),
                        ('source', models.CharField(choices=[('environment', 'Environment'), ('console', 'Console'), ('draft', 'Draft'), ('import', 'Import')], max_length=16)),
                        ('source_note', models.CharField(blank=True, max_length=200)),
                        ('version', models.PositiveIntegerField(default=1)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                    ],
                    options={
                        'db_table': 'brain_modelrole',
                        'constraints': [models.UniqueConstraint(fields=('role',), name='model_role_unique_role')],
                    },
                ),
                migrations.CreateModel(
                    name='ModelRoleRevision',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('role', models.CharField(choices=[('brain', 'brain'), ('delegation', 'delegation'), ('vision', 'vision'), ('executor_fast', 'executor_fast'), ('executor_thorough', 'executor_thorough'), ('realtime', 'realtime'), ('tts', 'tts'), ('asr_remote', 'asr_remote'), ('workshop_repair', 'workshop_repair')], max_length=24)),
                        ('provider', models.CharField(max_length=64)),
                        ('base_url', models.CharField(max_length=500)),
                        ('model', models.CharField(max_length=200)),
                        ('options', models.JSONField(blank=True, default=dict)),
                        ('api_key_encrypted', models.TextField(blank=True, null=True)),
                        ('source', models.CharField(choices=[('environment', 'Environment'), ('console', 'Console'), ('draft', 'Draft'), ('import', 'Import')], max_length=16)),
                        ('source_note', models.CharField(blank=True, max_length=200)),
                        ('version', models.PositiveIntegerField(default=1)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                    ],
                    options={
                        'db_table': 'brain_modelrolerevision',
                        'constraints': [models.UniqueConstraint(fields=('role', 'version'), name='model_role_revision_unique')],
                    },
                ),
                migrations.CreateModel(
                    name='ModelSwitch',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('kind', models.CharField(max_length=16)),
                        ('model_id', models.CharField(max_length=80)),
                        ('version', models.CharField(max_length=64)),
                        ('issued_at', models.DateTimeField()),
                        ('nonce', models.CharField(help_text='single use: replay guard', max_length=64, unique=True)),
                        ('message', models.TextField(help_text='the canonical message the device signed')),
                        ('signature', models.CharField(max_length=128)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('device', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='model_switches', to='devices.device')),
                    ],
                    options={
                        'verbose_name_plural': 'model switches',
                        'db_table': 'devices_modelswitch',
                    },
                ),
                migrations.CreateModel(
                    name='ModelUsage',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('role', models.CharField(db_index=True, max_length=32)),
                        ('provider', models.CharField(blank=True, max_length=128)),
                        ('model', models.CharField(blank=True, max_length=200)),
                        ('created_at', models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
                        ('input_tokens', models.PositiveIntegerField(blank=True, help_text='all input tokens, cached ones included', null=True)),
                        ('output_tokens', models.PositiveIntegerField(blank=True, null=True)),
                        ('cache_read_tokens', models.PositiveIntegerField(blank=True, help_text='part of the input read from the cache', null=True)),
                        ('cache_write_tokens', models.PositiveIntegerField(blank=True, help_text='part of the input written to the cache', null=True)),
                        ('tokens_source', models.CharField(choices=[('reported', 'Reported'), ('estimated', 'Estimated'), ('unknown', 'Unknown')], default='unknown', max_length=16)),
                        ('cost', models.DecimalField(blank=True, decimal_places=8, max_digits=16, null=True)),
                        ('currency', models.CharField(blank=True, max_length=8)),
                        ('cost_source', models.CharField(choices=[('priced', 'Priced'), ('estimated', 'Estimated'), ('unknown', 'Unknown')], default='unknown', max_length=16)),
                        ('duration_ms', models.PositiveIntegerField(default=0)),
                        ('outcome', models.CharField(default='ok', help_text='ok, or the BrainError code', max_length=32)),
                        ('agent_task', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='model_calls', to='brain.agenttask')),
                        ('run', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='model_calls', to='brain.run')),
                    ],
                    options={
                        'verbose_name': 'model usage',
                        'verbose_name_plural': 'model usage',
                        'db_table': 'brain_modelusage',
                        'ordering': ('-created_at',),
                    },
                ),
            ],
            database_operations=[],
        ),
        move_content_types(MODELS, 'brain', 'llm'),
    ]
