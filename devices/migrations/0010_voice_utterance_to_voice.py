# VoiceUtterance moved to the voice app. Its table stays where it is: this removes it from
# the devices app's state only, after voice/migrations/0001_initial.py added it to voice's,
# with the same table (db_table).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('devices', '0009_push_to_talk_holds'),
        ('voice', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(
                    name='VoiceUtterance',
                ),
            ],
            database_operations=[],
        ),
    ]
