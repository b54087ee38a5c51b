# Reminder, Schedule, Watch and WatchNotice moved here from the brain app. Their tables and
# rows stay as they are (brain_reminder, brain_schedule, brain_watch, brain_watchnotice):
# the models enter this app's state only, before brain/migrations/0020_schedules_moved_out.py
# takes them out of brain's. Their content types (and so their permissions and admin log
# entries) move along.

import uuid

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from yimi_project.migration_ops import move_content_types

MODELS = ('reminder', 'schedule', 'watch', 'watchnotice')



class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('brain', '0019_companion_models_moved'),
        ('contenttypes', '0002_remove_content_type_name'),
        ('devices', '0009_push_to_talk_holds'),
        ('memory', '0011_cold_packs'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='Reminder',
                    fields=[
                        ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ('text', models.CharField(max_length=500)),
                        ('due_at', models.DateTimeField(db_index=True)),
                        ('state', models.CharField(choices=[('scheduled', 'Scheduled'), ('fired', 'Fired'), ('cancelled', 'Cancelled')], db_index=True, default='scheduled', max_length=16)),
                        ('idempotency_key', models.CharField(blank=True, max_length=64, null=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('fired_at', models.DateTimeField(blank=True, null=True)),
                        ('cancelled_at', models.DateTimeField(blank=True, null=True)),
                        ('fired_entry', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='memory.timelineentry')),
                        ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='reminders', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'brain_reminder',
                        'constraints': [models.UniqueConstraint(condition=models.Q(('idempotency_key__isnull', False)), fields=('owner', 'idempotency_key'), name='reminder_idempotency_key_unique_per_owner')],
                    },
                ),
                migrations.CreateModel(
                    name='Schedule',
                    fields=[
                        ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ('prompt', models.TextField(help_text='what to do, as the owner would say it')),
                        ('interval_seconds', models.PositiveIntegerField(blank=True, null=True)),
                        ('daily_at', models.TimeField(blank=True, help_text='local time (TIME_ZONE)', null=True)),
                        ('next_run_at', models.DateTimeField(db_index=True)),
                        ('active', models.BooleanField(db_index=True, default=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('cancelled_at', models.DateTimeField(blank=True, null=True)),
                        ('device', models.ForeignKey(help_text='the device its runs answer on', on_delete=django.db.models.deletion.PROTECT, related_name='schedules', to='devices.device')),
                        ('last_run', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='brain.run')),
                        ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='schedules', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'brain_schedule',
                        'constraints': [models.CheckConstraint(condition=models.Q(models.Q(('interval_seconds__isnull', False), ('daily_at__isnull', True)), models.Q(('interval_seconds__isnull', True), ('daily_at__isnull', False)), _connector='OR'), name='schedule_interval_xor_daily')],
                    },
                ),
                migrations.CreateModel(
                    name='Watch',
                    fields=[
                        ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ('label', models.CharField(help_text='what the notice names, e.g. 快递 YT1234', max_length=200)),
                        ('tool', models.CharField(help_text='pack__tool, e.g. parcels__track', max_length=120)),
                        ('arguments', models.JSONField(blank=True, default=dict)),
                        ('state_path', models.CharField(default='content.state', max_length=200)),
                        ('s_from', models.CharField(max_length=64)),
                        ('s_to', models.CharField(max_length=64)),
                        ('interval_seconds', models.PositiveIntegerField(default=600)),
                        ('next_run_at', models.DateTimeField(db_index=True)),
                        ('active', models.BooleanField(db_index=True, default=True)),
                        ('last_state', models.CharField(blank=True, max_length=64)),
                        ('once', models.BooleanField(default=False)),
                        ('last_checked_at', models.DateTimeField(blank=True, null=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('cancelled_at', models.DateTimeField(blank=True, null=True)),
                        ('device', models.ForeignKey(help_text='the device its runs are bound to', on_delete=django.db.models.deletion.PROTECT, related_name='watches', to='devices.device')),
                        ('last_run', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='brain.run')),
                        ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='watches', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'verbose_name_plural': 'watches',
                        'db_table': 'brain_watch',
                    },
                ),
                migrations.CreateModel(
                    name='WatchNotice',
                    fields=[
                        ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ('state', models.CharField(choices=[('pending', 'Pending'), ('delivered', 'Delivered')], db_index=True, default='pending', max_length=16)),
                        ('sends', models.PositiveIntegerField(default=0)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('last_sent_at', models.DateTimeField(blank=True, null=True)),
                        ('delivered_at', models.DateTimeField(blank=True, null=True)),
                        ('entry', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='watch_notice', to='memory.timelineentry')),
                        ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to=settings.AUTH_USER_MODEL)),
                        ('watch', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='notices', to='schedules.watch')),
                    ],
                    options={
                        'db_table': 'brain_watchnotice',
                    },
                ),
            ],
            database_operations=[],
        ),
        move_content_types(MODELS, 'brain', 'schedules'),
    ]
