# Foreign keys to the device follow it to accounts (state only; the tables keep their names).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0005_device_identity'),
        ('payments', '0002_authorization_card_as_issued'),
    ]

    # State only: the tables and their constraints stay as they are (the models moved
    # between apps, keeping their table names), so an installed instance upgrades in place.
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='paymentauthorization',
                    name='authorized_by',
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='accounts.device'),
                ),
                migrations.AlterField(
                    model_name='unlocklease',
                    name='device',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='unlock_leases', to='accounts.device'),
                ),
            ],
        ),
    ]
