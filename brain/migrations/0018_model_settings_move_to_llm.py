# The model roles, their revisions, drafts, model usage, and the local model catalog's
# selections and signed switches moved to the llm app (issue 36). Their tables stay where
# they are: this removes them from the brain app's state only, after
# llm/migrations/0001_initial.py added them to llm's, with the same tables (db_table).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('brain', '0017_watch_verbose_name_plural'),
        ('llm', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(
                    name='ModelRole',
                ),
                migrations.DeleteModel(
                    name='ModelRoleDraft',
                ),
                migrations.DeleteModel(
                    name='ModelRoleRevision',
                ),
                migrations.DeleteModel(
                    name='ModelSelection',
                ),
                migrations.DeleteModel(
                    name='ModelSettingsImport',
                ),
                migrations.DeleteModel(
                    name='ModelSwitch',
                ),
                migrations.DeleteModel(
                    name='ModelUsage',
                ),
            ],
            database_operations=[],
        ),
    ]
