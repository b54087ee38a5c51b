from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("brain", "0009_model_roles"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="trace",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
