# Reminder, Schedule, Watch and WatchNotice moved to the schedules app. Their tables stay
# where they are: schedules/migrations/0001_initial.py added them to that app's state (with
# the same tables, db_table) and moved their content types; this removes them from brain's
# state only. No other model has a foreign key to them.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('brain', '0019_companion_models_moved'),
        ('schedules', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(
                    name='WatchNotice',
                ),
                migrations.DeleteModel(
                    name='Watch',
                ),
                migrations.DeleteModel(
                    name='Schedule',
                ),
                migrations.DeleteModel(
                    name='Reminder',
                ),
            ],
            database_operations=[],
        ),
    ]
