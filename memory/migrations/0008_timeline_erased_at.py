from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("memory", "0007_ambient_log")]

    operations = [
        migrations.AddField(model_name="timelineentry", name="erased_at", field=models.DateTimeField(blank=True, null=True)),
    ]
