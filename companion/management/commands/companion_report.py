"""``manage.py companion_report [--days N] [--owner ID] [--json]``.

Per owner, over the last N days (7 by default): calls, first-audio latency p50/p95 (call
start → the device's first ``played`` in the call), snapshot failures, reconnects,
barge-ins, and from the calls' summaries the repeated questions, short-reply loops and
refused topics Yimi raised (``companion.events.report``). Events still in a web
process's buffer (at most ``FLUSH_SECONDS`` old) are not in the database yet.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from companion import events

COLUMNS = (
    ("owner", "owner"), ("calls", "calls"), ("first_audio_n", "played"), ("first_audio_p50_ms", "first audio p50 ms"),
    ("first_audio_p95_ms", "p95 ms"), ("snapshot_failures", "snapshot fails"), ("reconnects", "reconnects"),
    ("barge_ins", "barge-ins"), ("repeated_questions", "repeated questions"), ("short_reply_loops", "short-reply loops"),
    ("refused_raised", "refused raised"),
)


class Command(BaseCommand):
    help = "First-audio latency and conversation counts of the companion's calls, per owner."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--days", type=int, default=7, help="look back this many days (default 7)")
        parser.add_argument("--owner", type=int, help="only this owner's id")
        parser.add_argument("--json", action="store_true", help="one JSON object per owner instead of the table")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["days"] < 1:
            raise CommandError("--days must be at least 1")
        since = timezone.now() - timedelta(days=opts["days"])
        self.stderr.write(f"reading call events and summaries since {since.isoformat(timespec='seconds')} …")
        rows = events.report(since=since, owner_id=opts.get("owner"))
        if opts["json"]:
            for row in rows:
                self.stdout.write(json.dumps(row))
            return
        if not rows:
            self.stdout.write("no calls in this period")
            return
        cells = [[title for _, title in COLUMNS]] + [["-" if row[key] is None else str(row[key]) for key, _ in COLUMNS] for row in rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
        for i, r in enumerate(cells):
            self.stdout.write("  ".join(c.rjust(w) for c, w in zip(r, widths)))
            if i == 0:
                self.stdout.write("  ".join("-" * w for w in widths))
