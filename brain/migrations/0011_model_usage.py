import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("brain", "0010_run_trace"),
    ]

    operations = [
        migrations.CreateModel(
            name="ModelUsage",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("role", models.CharField(db_index=True, max_length=32)),
                ("provider", models.CharField(blank=True, max_length=128)),
                ("model", models.CharField(blank=True, max_length=200)),
                ("created_at", models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
                ("input_tokens", models.PositiveIntegerField(blank=True, help_text="all input tokens, cached ones included", null=True)),
                ("output_tokens", models.PositiveIntegerField(blank=True, null=True)),
                ("cache_read_tokens", models.PositiveIntegerField(blank=True, help_text="part of the input read from the cache", null=True)),
                ("cache_write_tokens", models.PositiveIntegerField(blank=True, help_text="part of the input written to the cache", null=True)),
                ("tokens_source", models.CharField(choices=[("reported", "Reported"), ("estimated", "Estimated"), ("unknown", "Unknown")], default="unknown", max_length=16)),
                ("cost", models.DecimalField(blank=True, decimal_places=8, max_digits=16, null=True)),
                ("currency", models.CharField(blank=True, max_length=8)),
                ("cost_source", models.CharField(choices=[("priced", "Priced"), ("estimated", "Estimated"), ("unknown", "Unknown")], default="unknown", max_length=16)),
                ("duration_ms", models.PositiveIntegerField(default=0)),
                ("outcome", models.CharField(default="ok", help_text="ok, or the BrainError code", max_length=32)),
                ("agent_task", models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="model_calls", to="brain.agenttask")),
                ("run", models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="model_calls", to="brain.run")),
            ],
            options={
                "verbose_name": "model usage",
                "verbose_name_plural": "model usage",
                "ordering": ("-created_at",),
            },
        ),
    ]
