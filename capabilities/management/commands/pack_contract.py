"""``manage.py pack_contract``: run capability packs' contract tests.

    pack_contract                      # every pack in YIMI_PACKS_DIR, real servers
    pack_contract messaging schedule   # only these packs
    pack_contract --fake               # the fakes instead
    pack_contract --both               # real servers and fakes
    pack_contract --both --against-live  # also the platform-backed real servers (see below)

Each host runs sandboxed with what its pack declares, on temporary directories of its own.
A pack with a ``platform_api`` (memory, schedule) has no real server apart from the
platform: its real contract runs against the running platform's internal socket, acting
for the live owner with a capability per step, so it writes into the owner's memory and
schedule (reminders in 2099, cancelled; assertions committed, then forgotten, which leaves
their history). Those runs are held back, shown as ``skip``, unless ``--against-live``
says to run them; their fakes always run. Prints one row per case and exits non-zero if
any case failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from accounts.services import get_owner
from capabilities.contract import ContractReport, run_contract
from capabilities.manifest import ManifestError, load_pack


class Command(BaseCommand):
    help = "Run the contract tests of capability packs against their real servers and/or fakes."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("packs", nargs="*", metavar="PACK", help="pack names (default: every pack)")
        which = parser.add_mutually_exclusive_group()
        which.add_argument("--fake", action="store_true", help="run against the fakes only")
        which.add_argument("--both", action="store_true", help="run against the real servers and the fakes")
        parser.add_argument("--packs-dir", type=Path, default=None, help="default: settings.YIMI_PACKS_DIR")
        parser.add_argument(
            "--against-live",
            action="store_true",
            help="also run the real contracts of packs with a platform_api (memory, schedule): they act on the live "
            "owner's memory and schedule through the running platform",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        packs_dir = Path(options["packs_dir"] or settings.YIMI_PACKS_DIR).resolve()
        names = options["packs"] or sorted(
            p.name for p in packs_dir.iterdir() if (p / "plugin.json").exists() and not p.name.startswith((".", "_"))
        )
        if not names:
            raise CommandError(f"no packs in {packs_dir}")
        fakes = [True] if options["fake"] else [False, True] if options["both"] else [False]
        owner = get_owner()
        reports: list[ContractReport] = []
        held_back: list[str] = []
        for name in names:
            for fake in fakes:
                if not fake and not options["against_live"] and acts_on_live_owner(packs_dir / name):
                    held_back.append(name)
                    continue
                reports.append(run_contract(packs_dir / name, fake=fake, owner_id=owner.pk if owner is not None else None))
        failed = self.print_table(reports, held_back)
        if failed:
            raise CommandError(f"{failed} contract run(s) failed")

    def print_table(self, reports: list[ContractReport], held_back: Sequence[str] = ()) -> int:
        rows = [("PACK", "IMPL", "RESULT", "CASE")]
        details: list[tuple[int, list[str]]] = []
        for name in held_back:
            rows.append((name, "real", "skip", "(acts on the live owner's data: run with --against-live)"))
        for report in reports:
            for error in report.errors:
                rows.append((report.pack, report.implementation, "ERROR", "(contract could not run)"))
                details.append((len(rows) - 1, [error]))
            for case in report.cases:
                rows.append((report.pack, report.implementation, "pass" if case.passed else "FAIL", case.name))
                if case.failures:
                    details.append((len(rows) - 1, case.failures))
            for name in report.skipped:
                rows.append((report.pack, report.implementation, "skip", name))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        notes = dict(details)
        for index, row in enumerate(rows):
            line = "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + "  " + row[3]
            style = self.style.ERROR if row[2] in ("FAIL", "ERROR") else (lambda s: s)
            self.stdout.write(style(line))
            for note in notes.get(index, []):
                self.stdout.write(f"      - {note}")
        failed = sum(1 for r in reports if not r.passed)
        total = len(reports)
        self.stdout.write(f"{total - failed}/{total} contract runs passed")
        if held_back:
            self.stdout.write(
                f"held back: the real {', '.join(held_back)} contract(s) would write into the live owner's memory "
                "and schedule; --against-live runs them"
            )
        return failed


# Platform APIs that touch no owner data: the ``executor`` API only answers model steps
# (the phone pack's loop), so a pack using only it runs its real contract.
NO_OWNER_DATA_APIS = frozenset({"executor"})


def acts_on_live_owner(pack_dir: Path) -> bool:
    """Does this pack's real server act through the platform (a ``platform_api`` other than
    ``NO_OWNER_DATA_APIS``), and so on the live owner's data? A pack whose manifest does not
    load is run (and reported)."""
    try:
        return bool(set(load_pack(pack_dir).platform_api) - NO_OWNER_DATA_APIS)
    except ManifestError:
        return False
