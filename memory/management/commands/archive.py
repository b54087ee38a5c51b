"""``manage.py archive``: the operator's view of cold packs (docs/memory.md "Cold packs").

    archive status            hot bytes, free bytes and inodes, originals waiting, packs pending/verified/failed
    archive migrate           one migration round now (progress per pack), then due releases
    archive verify PACK       download one verified pack and check it whole
    archive restore OBJECT --out FILE   fetch one original (hot copy, or one range read from its pack)
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from accounts.services import get_owner
from memory import archive, raw_store
from memory.raw_models import RawObject
from yimi_project.errors import YimiError


class Command(BaseCommand):
    help = "Cold packs: status, one migration round, verify a pack, restore an original."

    def add_arguments(self, parser: Any) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("status")
        sub.add_parser("migrate")
        verify = sub.add_parser("verify")
        verify.add_argument("pack", help="the pack's id (see the admin or status)")
        restore = sub.add_parser("restore")
        restore.add_argument("object", type=int, help="the original's id")
        restore.add_argument("--out", type=Path, help="write the original here (default: raw-<id>.bin in the current directory)")

    def handle(self, *args: Any, **options: Any) -> None:
        owner = get_owner()
        if owner is None:
            raise CommandError("no owner: run manage.py yimi_init first")
        say = self.stdout.write
        try:
            if options["action"] == "status":
                for line in archive.status(owner.pk).lines():
                    say(line)
            elif options["action"] == "migrate":
                report = archive.migrate_round(owner.pk, progress=say)
                say(f"round ended: {report.stopped}; {len(report.packs_verified)} packs verified, "
                    f"{len(report.packs_failed)} failed, {report.objects_packed} originals packed, "
                    f"{len(report.released)} packs released")
            elif options["action"] == "verify":
                chunks = archive.check_pack(options["pack"], progress=say)
                say(f"verified: {chunks} chunks, the whole pack's SHA-256 and every chunk's")
            else:
                self.restore(owner.pk, options["object"], options["out"])
        except YimiError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from None

    def restore(self, owner_id: int, object_id: int, out: Path | None) -> None:
        obj = RawObject.objects.filter(owner_id=owner_id, pk=object_id).first()
        if obj is None:
            raise YimiError("not_found", f"no original {object_id}")
        self.stdout.write(f"original {obj.pk}: {obj.kind} {obj.codec}, {obj.size} bytes")
        original = raw_store.read_original(obj)
        target = out or Path(f"raw-{obj.pk}.bin")
        target.write_bytes(original.data)
        self.stdout.write(f"restored from the {original.source} copy to {target} "
                          f"(SHA-256 {hashlib.sha256(original.data).hexdigest()[:16]}… matches)")
