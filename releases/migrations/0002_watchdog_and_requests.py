# Rollback requests, protected-baseline cards, and the release state ``refused`` (#20).

import uuid

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('releases', '0001_initial'),
        ('devices', '0001_initial'),
        ('memory', '0001_initial'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name='release',
            name='state',
            field=models.CharField(choices=[('built', 'Built'), ('gated', 'Gated'), ('rejected', 'Rejected'), ('void', 'Void'), ('switched', 'Switched'), ('failed', 'Failed'), ('rolled_back', 'Rolled Back'), ('refused', 'Refused'), ('removed', 'Removed')], db_index=True, default='built', max_length=16),
        ),
        migrations.CreateModel(
            name='RollbackRequest',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('reason', models.TextField(help_text="the owner's own words")),
                ('from_build', models.CharField(blank=True, help_text='the build that was current when the owner asked', max_length=100)),
                ('to_build', models.CharField(blank=True, help_text='the build it went back to', max_length=100)),
                ('state', models.CharField(choices=[('pending', 'Pending'), ('executing', 'Executing'), ('executed', 'Executed'), ('refused', 'Refused'), ('failed', 'Failed')], db_index=True, default='pending', max_length=16)),
                ('state_reason', models.TextField(blank=True)),
                ('requested_at', models.DateTimeField()),
                ('claimed_at', models.DateTimeField(blank=True, help_text='when an executor took it', null=True)),
                ('decided_at', models.DateTimeField(blank=True, null=True)),
                ('notice', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='memory.timelineentry')),
                ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='rollback_requests', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['-requested_at'],
            },
        ),
        migrations.CreateModel(
            name='BaselineCard',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('areas', models.JSONField(default=list, help_text='the protected areas the diff touches')),
                ('paths', models.JSONField(default=list, help_text='the touched protected paths (at most 50)')),
                ('summary', models.CharField(blank=True, help_text="the fix's first line", max_length=200)),
                ('state', models.CharField(choices=[('pending', 'Pending'), ('approved', 'Approved'), ('refused', 'Refused')], db_index=True, default='pending', max_length=16)),
                ('created_at', models.DateTimeField()),
                ('answered_at', models.DateTimeField(blank=True, null=True)),
                ('answered_via', models.CharField(blank=True, max_length=16)),
                ('answered_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='devices.device')),
                ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='baseline_cards', to=settings.AUTH_USER_MODEL)),
                ('release', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='baseline_card', to='releases.release')),
            ],
        ),
    ]
