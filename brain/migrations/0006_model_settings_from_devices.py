# ModelSelection and ModelSwitch moved here from the devices app. Their tables and rows stay
# as they are (devices_modelselection, devices_modelswitch): the models enter brain's state
# only, after devices/migrations/0006_model_settings_move_to_brain.py took them out of
# devices'. Their content types (and so their permissions and admin log entries) move along.

import django.db.models.deletion
from django.db import migrations, models

MODELS = ('modelselection', 'modelswitch')


def move_content_types(from_app, to_app):
    def move(apps, schema_editor):
        ContentType = apps.get_model('contenttypes', 'ContentType')
        content_types = ContentType.objects.using(schema_editor.connection.alias)
        for model in MODELS:
            if not content_types.filter(app_label=to_app, model=model).exists():
                content_types.filter(app_label=from_app, model=model).update(app_label=to_app)
        ContentType.objects.clear_cache()

    return move


class Migration(migrations.Migration):

    dependencies = [
        ('brain', '0005_run_origin'),
        ('contenttypes', '0002_remove_content_type_name'),
        ('devices', '0006_model_settings_move_to_brain'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
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
            ],
            database_operations=[],
        ),
        migrations.RunPython(move_content_types('devices', 'brain'), move_content_types('brain', 'devices')),
    ]
