import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("memory", "0009_location_and_health"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="RawObject",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("device_id", models.UUIDField(blank=True, help_text="the capturing device's id (no FK: memory sits below devices)", null=True)),
                ("channel", models.CharField(help_text="capture channel (phone_app, glasses, mac, ...)", max_length=32)),
                ("kind", models.CharField(choices=[("audio", "Audio"), ("image", "Image"), ("sensor", "Sensor")], max_length=8)),
                ("codec", models.CharField(help_text='e.g. "pcm_s16le_16k_mono", "image/jpeg", "application/json"', max_length=64)),
                ("stream", models.CharField(blank=True, max_length=64)),
                ("stream_offset", models.BigIntegerField(default=0, help_text="first sample (audio) of this object in its stream")),
                ("meta", models.JSONField(blank=True, default=dict, help_text="small facts about the original (image size, sensor name)")),
                ("started_at", models.DateTimeField()),
                ("ended_at", models.DateTimeField()),
                ("size", models.BigIntegerField()),
                ("sha256", models.CharField(max_length=64)),
                ("hot_path", models.CharField(help_text="relative to the hot root", max_length=300)),
                ("stored_at", models.DateTimeField(auto_now_add=True)),
                ("hot_deleted_at", models.DateTimeField(blank=True, null=True)),
                ("erased_at", models.DateTimeField(blank=True, null=True)),
                (
                    "owner",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="raw_objects", to=settings.AUTH_USER_MODEL
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["owner", "started_at"], name="raw_owner_started"),
                    models.Index(fields=["hot_deleted_at", "stored_at"], name="raw_hot_stored"),
                ],
            },
        ),
    ]
