# Device identity moves from devices to accounts (state only; the tables keep their names).

import django.db.models.deletion
import uuid
from django.conf import settings
from django.db import migrations, models

from yimi_project.migration_ops import move_content_types


MOVED = ('device', 'pairingcode', 'pairingguessslot', 'signedrequestnonce')



class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0004_face_enrollment'),
        ('contenttypes', '0002_remove_content_type_name'),
        ('devices', '0010_voice_utterance_to_voice'),
    ]

    # State only: the tables and their constraints stay as they are (the models moved
    # between apps, keeping their table names), so an installed instance upgrades in place.
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='Device',
                    fields=[
                        ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ('name', models.CharField(max_length=64)),
                        ('kind', models.CharField(choices=[('phone', 'Phone'), ('watch', 'Watch'), ('mac', 'Mac'), ('glasses', 'Glasses')], max_length=16)),
                        ('capture_channels', models.JSONField(blank=True, default=list)),
                        ('public_key', models.CharField(help_text='raw Ed25519 public key, base64', max_length=64, unique=True)),
                        ('is_guest', models.BooleanField(default=False, help_text='text from a guest device runs in scope guest')),
                        ('paired_at', models.DateTimeField(auto_now_add=True)),
                        ('last_seen_at', models.DateTimeField(blank=True, null=True)),
                        ('revoked_at', models.DateTimeField(blank=True, null=True)),
                        ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='devices', to=settings.AUTH_USER_MODEL)),
                        ('relay_via', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='relayed', to='accounts.device')),
                    ],
                    options={
                        'db_table': 'devices_device',
                    },
                ),
                migrations.AlterField(
                    model_name='admissionrecord',
                    name='device',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='admissions', to='accounts.device'),
                ),
                migrations.AlterField(
                    model_name='trustwindow',
                    name='device',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='trust_windows', to='accounts.device'),
                ),
                migrations.AlterField(
                    model_name='voicecall',
                    name='device',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='voice_calls', to='accounts.device'),
                ),
                migrations.CreateModel(
                    name='PairingCode',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('digest', models.CharField(max_length=64, unique=True)),
                        ('for_guest', models.BooleanField(default=False)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('expires_at', models.DateTimeField()),
                        ('used_at', models.DateTimeField(blank=True, null=True)),
                        ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='pairing_codes', to=settings.AUTH_USER_MODEL)),
                        ('used_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='accounts.device')),
                    ],
                    options={
                        'db_table': 'devices_pairingcode',
                    },
                ),
                migrations.CreateModel(
                    name='PairingGuessSlot',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('scope', models.CharField(help_text='address:<client address>, or everyone', max_length=80)),
                        ('number', models.PositiveSmallIntegerField()),
                        ('taken_at', models.DateTimeField(db_index=True)),
                    ],
                    options={
                        'db_table': 'devices_pairingguessslot',
                        'constraints': [models.UniqueConstraint(fields=('scope', 'number'), name='one_pairing_guess_slot_per_number')],
                    },
                ),
                migrations.CreateModel(
                    name='SignedRequestNonce',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('nonce', models.CharField(max_length=64)),
                        ('expires_at', models.DateTimeField(db_index=True, help_text="the request's timestamp + the allowed skew")),
                        ('device', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='accounts.device')),
                    ],
                    options={
                        'db_table': 'devices_signedrequestnonce',
                        'constraints': [models.UniqueConstraint(fields=('device', 'nonce'), name='one_use_per_request_nonce')],
                    },
                ),
            ],
        ),
        move_content_types(MOVED, 'devices', 'accounts'),
    ]
