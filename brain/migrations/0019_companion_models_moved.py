"""The companion's models leave the brain app's state (issue 36): they live in the
``companion`` app now, on the same tables (``companion 0001``, which renamed their content
types). State only: no table is dropped."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('brain', '0018_model_settings_move_to_llm'),
        ('companion', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                # the models that point at others first
                migrations.DeleteModel(name='TopicState'),
                migrations.DeleteModel(name='CallSnapshot'),
                migrations.DeleteModel(name='CallSummary'),
                migrations.DeleteModel(name='CallEvent'),
                migrations.DeleteModel(name='ContentCard'),
                migrations.DeleteModel(name='PersonaVersion'),
                migrations.DeleteModel(name='PrivacyEpoch'),
                migrations.DeleteModel(name='CompanionSettings'),
            ],
        ),
    ]
