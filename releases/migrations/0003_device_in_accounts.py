# Foreign keys to the device follow it to accounts (state only; the tables keep their names).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0005_device_identity'),
        ('releases', '0002_watchdog_and_requests'),
    ]

    # State only: the tables and their constraints stay as they are (the models moved
    # between apps, keeping their table names), so an installed instance upgrades in place.
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='baselinecard',
                    name='answered_by',
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='accounts.device'),
                ),
            ],
        ),
    ]
