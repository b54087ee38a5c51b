# Device identity moves from devices to accounts (state only; the tables keep their names).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        # Every foreign key to the device points at accounts.Device before devices' goes.
        ('brain', '0021_device_in_accounts'),
        ('consent', '0002_device_in_accounts'),
        ('llm', '0002_device_in_accounts'),
        ('memory', '0012_device_in_accounts'),
        ('payments', '0003_device_in_accounts'),
        ('releases', '0003_device_in_accounts'),
        ('schedules', '0002_device_in_accounts'),
        ('voice', '0002_device_in_accounts'),
        ('accounts', '0005_device_identity'),
        ('devices', '0010_voice_utterance_to_voice'),
    ]

    # State only: the tables and their constraints stay as they are (the models moved
    # between apps, keeping their table names), so an installed instance upgrades in place.
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(
                    model_name='device',
                    name='owner',
                ),
                migrations.RemoveField(
                    model_name='device',
                    name='relay_via',
                ),
                migrations.AlterField(
                    model_name='delivery',
                    name='device',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='deliveries', to='accounts.device'),
                ),
                migrations.AlterField(
                    model_name='macoperation',
                    name='device',
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='mac_operations', to='accounts.device'),
                ),
                migrations.AlterField(
                    model_name='devicestate',
                    name='device',
                    field=models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='state', serialize=False, to='accounts.device'),
                ),
                migrations.AlterField(
                    model_name='pushtotalkhold',
                    name='device',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='accounts.device'),
                ),
                migrations.AlterField(
                    model_name='macpause',
                    name='changed_by',
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='accounts.device'),
                ),
                migrations.AlterField(
                    model_name='mackey',
                    name='device',
                    field=models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='mac_key', serialize=False, to='accounts.device'),
                ),
                migrations.RemoveField(
                    model_name='pairingcode',
                    name='used_by',
                ),
                migrations.RemoveField(
                    model_name='signedrequestnonce',
                    name='device',
                ),
                migrations.RemoveField(
                    model_name='pairingcode',
                    name='owner',
                ),
                migrations.DeleteModel(
                    name='PairingGuessSlot',
                ),
                migrations.DeleteModel(
                    name='Device',
                ),
                migrations.DeleteModel(
                    name='SignedRequestNonce',
                ),
                migrations.DeleteModel(
                    name='PairingCode',
                ),
            ],
        ),
    ]
