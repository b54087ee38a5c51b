# ModelSelection and ModelSwitch moved to the brain app (the model authority). Their tables
# stay where they are: this removes them from the devices app's state only, and
# brain/migrations/0006_model_settings_from_devices.py adds them to brain's, with the same
# tables (db_table).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('devices', '0005_signed_request_nonces'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(
                    name='ModelSelection',
                ),
                migrations.DeleteModel(
                    name='ModelSwitch',
                ),
            ],
            database_operations=[],
        ),
    ]
