from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("brain", "0011_model_usage"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="enqueued_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
