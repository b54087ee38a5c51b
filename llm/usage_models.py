"""One row per model call: who asked (role, run, sub-agent task), which model, what the
provider says it cost in tokens, and what that costs by the deployer's price table.

Honesty is in the columns, not in the numbers: a count the provider did not report is
NULL with ``tokens_source = unknown`` (never 0); a count made on this host is
``estimated``; a cost without a price for the provider and model is NULL with
``cost_source = unknown``. Written only by ``llm.usage``.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class ModelUsage(models.Model):
    class TokensSource(models.TextChoices):
        REPORTED = "reported"  # the provider's own ``usage`` object
        ESTIMATED = "estimated"  # counted on this host (llm.usage.estimate_tokens)
        UNKNOWN = "unknown"  # the provider said nothing and nothing was counted

    class CostSource(models.TextChoices):
        PRICED = "priced"  # reported tokens × a listed price
        ESTIMATED = "estimated"  # estimated tokens, or a price that had to stand in for a missing one
        UNKNOWN = "unknown"  # no price for this provider and model, or no token counts

    role = models.CharField(max_length=32, db_index=True)
    provider = models.CharField(max_length=128, blank=True)
    model = models.CharField(max_length=200, blank=True)
    run = models.ForeignKey("brain.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="model_calls")
    agent_task = models.ForeignKey(
        "brain.AgentTask", null=True, blank=True, on_delete=models.SET_NULL, related_name="model_calls"
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    input_tokens = models.PositiveIntegerField(null=True, blank=True, help_text="all input tokens, cached ones included")
    output_tokens = models.PositiveIntegerField(null=True, blank=True)
    cache_read_tokens = models.PositiveIntegerField(null=True, blank=True, help_text="part of the input read from the cache")
    cache_write_tokens = models.PositiveIntegerField(null=True, blank=True, help_text="part of the input written to the cache")
    tokens_source = models.CharField(max_length=16, choices=TokensSource.choices, default=TokensSource.UNKNOWN)
    cost = models.DecimalField(max_digits=16, decimal_places=8, null=True, blank=True)
    currency = models.CharField(max_length=8, blank=True)
    cost_source = models.CharField(max_length=16, choices=CostSource.choices, default=CostSource.UNKNOWN)
    duration_ms = models.PositiveIntegerField(default=0)
    outcome = models.CharField(max_length=32, default="ok", help_text="ok, or the BrainError code")

    class Meta:
        db_table = "brain_modelusage"  # the table it had before it moved to llm
        verbose_name = "model usage"
        verbose_name_plural = "model usage"
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return f"{self.role} {self.model} {self.created_at:%Y-%m-%d %H:%M} ({self.outcome})"
