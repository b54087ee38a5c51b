# Foreign keys to the device follow it to accounts (state only; the tables keep their names).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0005_device_identity'),
        ('schedules', '0001_initial'),
    ]

    # State only: the tables and their constraints stay as they are (the models moved
    # between apps, keeping their table names), so an installed instance upgrades in place.
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='schedule',
                    name='device',
                    field=models.ForeignKey(help_text='the device its runs answer on', on_delete=django.db.models.deletion.PROTECT, related_name='schedules', to='accounts.device'),
                ),
                migrations.AlterField(
                    model_name='watch',
                    name='device',
                    field=models.ForeignKey(help_text='the device its runs are bound to', on_delete=django.db.models.deletion.PROTECT, related_name='watches', to='accounts.device'),
                ),
            ],
        ),
    ]
