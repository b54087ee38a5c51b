"""``manage.py archive``: the operator's view of cold packs (docs/memory.md "Cold packs").

    archive status            hot bytes, free bytes and inodes, originals waiting, packs pending/verified/failed
    archive migrate           one migration round now (progress per pack), then due releases
    archive verify PACK       download one verified pack and check it whole
    archive restore OBJECT    put the original's hot copy back from its pack (one range read,
                              disk admission like any write); --out FILE writes it to FILE instead
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from accounts.services import get_owner
from memory.archive import cold_store as archive
from memory.archive import raw_store
from memory.archive.models import RawObject
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
        restore.add_argument("--out", type=Path, help="write the original to this file instead of restoring its hot copy")

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
        if out is None:
            had_hot = obj.hot_deleted_at is None
            original = raw_store.restore_hot_copy(obj)
            if original.source == "hot":
                self.stdout.write(f"the hot copy is there and intact ({raw_store.hot_file(obj)}); nothing to restore")
            else:
                self.stdout.write(f"{'repaired' if had_hot else 'restored'} the hot copy from its cold pack to "
                                  f"{raw_store.hot_file(obj)} (SHA-256 {hashlib.sha256(original.data).hexdigest()[:16]}… matches)")
            return
        original = raw_store.read_original(obj)
        out.write_bytes(original.data)
        self.stdout.write(f"wrote the {original.source} copy to {out} "
                          f"(SHA-256 {hashlib.sha256(original.data).hexdigest()[:16]}… matches)")
