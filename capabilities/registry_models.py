"""The pack registry's tables (issue 18, flow F4): candidates, packs and their versions.

- ``PackCandidate``: one candidate pack, identified by the SHA-256 content digest of its
  normalized file list, with the results of the static and honesty checks it went through.
- ``RegisteredPack``: one row per pack name, shipped or published: the enable switch the
  staff and operators set, and the version that is online (a compare-and-swap pointer).
- ``PackVersion``: the version history of a pack: every version that was online, which
  version it replaced, when it went off and why, and the monitoring figures.
- ``SecretGrant``: a secret granted to one pack (by name and origin), or revoked.

Only ``capabilities.registry`` writes these tables.
"""

from __future__ import annotations

from django.db import models


class PackCandidate(models.Model):
    """A candidate pack as the workshop (or an operator) handed it to the registry."""

    class Origin(models.TextChoices):
        WORKSHOP = "workshop"  # built by Yimi herself (maintainer must be "yimi")
        OPERATOR = "operator"  # handed in with ``manage.py pack check``

    class State(models.TextChoices):
        REFUSED = "refused"  # a static or honesty check failed
        PASSED = "passed"  # both checks passed: publishable

    digest = models.CharField(max_length=64, unique=True, help_text="sha256 over the normalized file list")
    name = models.CharField(max_length=64, blank=True, db_index=True, help_text="the manifest's name, when it has one")
    version = models.CharField(max_length=32, blank=True)
    maintainer = models.CharField(max_length=16, blank=True)
    origin = models.CharField(max_length=16, choices=Origin.choices)
    built_against = models.CharField(
        max_length=64, blank=True, help_text="digest of the online version it was built against; empty for a new pack"
    )
    state = models.CharField(max_length=16, choices=State.choices)
    path = models.CharField(max_length=500, blank=True, help_text="the registry's own copy (empty when refused statically)")
    manifest = models.JSONField(default=dict, blank=True)
    files = models.JSONField(default=list, help_text="[path, size, sha256] per file")
    static_report = models.JSONField(default=list, help_text="findings of the static checks: code, path, message")
    honesty_report = models.JSONField(default=dict, help_text="runs and findings of the honesty checks")
    created_at = models.DateTimeField(auto_now_add=True)
    checked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name or '?'} {self.version} {self.digest[:12]} ({self.state})"


class RegisteredPack(models.Model):
    """A pack the platform knows: its enable switch and its online version.

    ``enabled`` is three-valued: ``None`` follows ``YIMI_PACKS_ENABLE`` and the manifest's
    ``enabled_by_default``; ``True``/``False`` is the staff's or operator's switch. Only
    ``YIMI_PACKS_DISABLE`` overrides it (capabilities.manifest.load_packs).
    """

    name = models.CharField(max_length=64, unique=True)
    enabled = models.BooleanField(null=True, blank=True, default=None)
    active = models.ForeignKey(
        "capabilities.PackVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+",
        help_text="the published version online; empty for a shipped pack or a removed one",
    )
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.name


class PackVersion(models.Model):
    """One version of a pack that was (or is) online."""

    class Origin(models.TextChoices):
        SHIPPED = "shipped"  # in the packs directory of the platform's release
        PUBLISHED = "published"  # through the registry

    class State(models.TextChoices):
        ACTIVE = "active"
        SUPERSEDED = "superseded"  # a newer version replaced it
        REVERTED = "reverted"  # taken back (monitoring or on request)

    pack = models.ForeignKey(RegisteredPack, on_delete=models.CASCADE, related_name="versions")
    origin = models.CharField(max_length=16, choices=Origin.choices)
    candidate = models.ForeignKey(PackCandidate, null=True, blank=True, on_delete=models.PROTECT, related_name="versions")
    digest = models.CharField(max_length=64)
    version = models.CharField(max_length=32)
    maintainer = models.CharField(max_length=16, blank=True)
    previous = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    state = models.CharField(max_length=16, choices=State.choices)
    activated_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=300, blank=True)
    monitoring = models.JSONField(default=dict, blank=True, help_text="the last maintenance cycle's figures")

    class Meta:
        indexes = [models.Index(fields=["pack", "-activated_at"])]

    def __str__(self) -> str:
        return f"{self.pack.name} {self.version} {self.digest[:12]} ({self.state})"


class SecretGrant(models.Model):
    """A secret (a file of the secrets directory) granted to one pack, or since revoked.

    A pack is named with its origin: ``shipped`` (in the platform's packs directory) or
    ``published`` (through the registry). A pack host gets a declared secret only when
    its pack holds a grant for it that is not revoked (``capabilities.mcp_host.sandbox``,
    through the projection ``capabilities.registry.grants`` writes). A revoked row stays,
    so starting the instance again never grants that secret back by itself.
    """

    class Origin(models.TextChoices):
        SHIPPED = "shipped"
        PUBLISHED = "published"

    pack_name = models.CharField(max_length=64)
    origin = models.CharField(max_length=16, choices=Origin.choices)
    secret = models.CharField(max_length=64, help_text="the secret file's name, as the pack's manifest declares it")
    granted = models.BooleanField(default=True, help_text="false: revoked")
    granted_by = models.CharField(max_length=150, blank=True)
    granted_at = models.DateTimeField()
    revoked_by = models.CharField(max_length=150, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["pack_name", "origin", "secret"], name="secret_grant_once")]
        ordering = ["pack_name", "origin", "secret"]

    def __str__(self) -> str:
        return f"{self.secret} → {self.pack_name} ({self.origin}{'' if self.granted else ', revoked'})"
