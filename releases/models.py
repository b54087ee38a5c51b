"""Releases of the platform itself (flows F5/F6) and their history.

A ``Release`` is one immutable build: on a Docker host an image (build id = the image
digest, ``sha256:…``); without Docker a release directory under the releases root — the
code at a commit (``git archive``) plus its virtual environment — whose build id is
``dir:<sha256 of the directory's manifest>`` (``releases.builds``). Which release runs is
not a row: it is the ``current`` / ``previous`` symlinks under the releases root
(``releases.pointers``), the one truth a separate watchdog process reads too. These rows
are the record: what was built, what the gate said, why a candidate was voided, and every
switch, rollback and cleanup (``ReleaseEvent``). Written only by ``releases.services``.
"""

from __future__ import annotations

from django.db import models


class Release(models.Model):
    """One build of the platform, from candidate to cleanup.

    ``state`` moves forward by conditional UPDATEs in ``releases.services``:
    built → gated | rejected | void | refused; gated → switched | failed | void | refused;
    switched → rolled_back; any → removed (cleanup; ``current`` and ``previous`` never).
    """

    class Kind(models.TextChoices):
        DOCKER = "docker"
        DIRECTORY = "directory"

    class State(models.TextChoices):
        BUILT = "built"  # built, not yet through the gate
        GATED = "gated"  # the gate passed: no new failure against the live base
        REJECTED = "rejected"  # the gate failed (new failures, or an unparsable non-zero exit)
        VOID = "void"  # its base is no longer the live commit: rebuild on the live version
        SWITCHED = "switched"  # switched in at least once (it may since have been rolled back)
        FAILED = "failed"  # its switch did not verify; the previous release was restored
        ROLLED_BACK = "rolled_back"  # it was live and was rolled back
        REFUSED = "refused"  # it touches the protected baseline and the owner said no (releases.baseline)
        REMOVED = "removed"  # cleanup deleted its directory (or image)

    build_id = models.CharField(max_length=100, unique=True, help_text="image digest, or dir:<sha256 of the manifest>")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    commit = models.CharField(max_length=40, help_text="the commit the release was built from")
    base_commit = models.CharField(
        max_length=40, blank=True, help_text="the live commit the candidate was made on (re-checked before the switch)"
    )
    path = models.CharField(max_length=1000, blank=True, help_text="the release directory (directory releases)")
    fix_line = models.CharField(
        max_length=200, blank=True, help_text="the commit message's first line, told to the owner after the switch"
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.BUILT, db_index=True)
    state_reason = models.TextField(blank=True)
    gate_result = models.JSONField(null=True, blank=True, help_text="failure sets of candidate and base, new failures")
    created_at = models.DateTimeField()
    switched_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.build_id[:24]} @ {self.commit[:12]} ({self.state})"


class ReleaseEvent(models.Model):
    """One line of the release history: build, gate, recheck, switch, switch_failed,
    rollback, rollback_requested, rollback_refused, cleanup, backup, notify, watchdog…

    ``kind`` is free text from ``releases.services.EVENT_KINDS`` (no choices: the watchdog
    adds its own kinds without a migration). ``from_build`` / ``to_build`` name the pointer
    move for switches and rollbacks.
    """

    release = models.ForeignKey(Release, null=True, blank=True, on_delete=models.SET_NULL, related_name="events")
    kind = models.CharField(max_length=32, db_index=True)
    from_build = models.CharField(max_length=100, blank=True)
    to_build = models.CharField(max_length=100, blank=True)
    reason = models.TextField(blank=True)
    details = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} at {self.at:%Y-%m-%d %H:%M:%S}"


from releases.request_models import BaselineCard, RollbackRequest  # noqa: E402,F401  (registered with the releases app)
