"""``manage.py pack``: the pack registry for operators (issue 18, flow F4).

    pack check DIR [--origin workshop|operator] [--built-against DIGEST | --against-online]
                                  # static + honesty checks; stores a candidate by digest
    pack publish DIGEST           # a checked candidate goes online (a unique prefix will do)
    pack revert NAME [--reason T] # back to the previous version; a first version is removed
    pack status [NAME]            # every pack: source, on/off, version online, monitoring;
                                  # with NAME: its version history and candidates
    pack switch NAME on|off|default   # the registry's enable switch
    pack grant NAME SECRET... [--origin shipped|published]   # the pack may have these secrets
    pack revoke NAME SECRET... [--origin shipped|published]  # from its next host start, no more
    pack grants [NAME]            # the secrets granted (and revoked), per pack
    pack build SOURCE             # the workshop builds SOURCE (a spec or a draft) into a candidate

Long steps (honesty checks, preloading, builds) print a progress line each. Errors are
printed with their stable code and exit non-zero. A refused candidate is printed with why:
each static finding, each honesty finding, and under each honesty run what could not run
and each failed case's problems; the last line names the rule codes. ``status NAME`` says
of each secret the pack declares whether it is granted (``secret_not_granted`` if not).
A secret belongs to the packs it was granted to (``capabilities.registry.grants``); the
origin defaults to ``shipped`` when the packs directory holds the pack, else ``published``. The command lives in the workshop app
because ``build`` needs the workshop, which sits above ``capabilities``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from capabilities.manifest import load_packs
from capabilities.mcp_host.secret_grants import NOT_GRANTED, ORIGINS, origin_of
from capabilities.registry import add_candidate, grants, online_digest, publish, revert, set_enabled
from capabilities.registry.publish import record_shipped_versions
from capabilities.registry_models import PackCandidate, PackVersion, RegisteredPack, SecretGrant
from yimi_project.errors import YimiError


class Command(BaseCommand):
    help = "The pack registry: check, publish, revert, switch and inspect capability packs; build one in the workshop."

    def add_arguments(self, parser: Any) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        check = actions.add_parser("check", help="static and honesty checks; stores the candidate")
        check.add_argument("directory", type=Path)
        check.add_argument("--origin", choices=PackCandidate.Origin.values, default=PackCandidate.Origin.OPERATOR)
        against = check.add_mutually_exclusive_group()
        against.add_argument("--built-against", default=None, help="digest of the online version it was built against")
        against.add_argument("--against-online", action="store_true", help="built against whatever is online now")
        pub = actions.add_parser("publish", help="put a checked candidate online")
        pub.add_argument("digest")
        rev = actions.add_parser("revert", help="back to the previous version (a first version is removed)")
        rev.add_argument("name")
        rev.add_argument("--reason", default="reverted by the operator")
        status = actions.add_parser("status", help="packs, versions, monitoring")
        status.add_argument("name", nargs="?")
        switch = actions.add_parser("switch", help="the registry's enable switch for a pack")
        switch.add_argument("name")
        switch.add_argument("state", choices=("on", "off", "default"))
        for verb, words in (("grant", "grant secrets to a pack"), ("revoke", "revoke secrets granted to a pack")):
            sub = actions.add_parser(verb, help=words)
            sub.add_argument("name")
            sub.add_argument("secrets", nargs="+", metavar="SECRET")
            sub.add_argument("--origin", choices=ORIGINS, default=None, help="default: shipped if the packs directory holds it, else published")
        listed = actions.add_parser("grants", help="the secrets granted to each pack")
        listed.add_argument("name", nargs="?")
        build = actions.add_parser("build", help="build a candidate in the workshop")
        build.add_argument("source", type=Path)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            getattr(self, f"do_{options['action']}")(options)
        except YimiError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from None

    def progress(self, line: str) -> None:
        self.stdout.write(f"  … {line}")
        self.stdout.flush()

    def do_check(self, options: dict[str, Any]) -> None:
        directory = Path(options["directory"])
        if not directory.is_dir():
            raise CommandError(f"not_found: {directory} is not a directory")
        built_against = options["built_against"]
        if options["against_online"]:
            from capabilities.registry.checks import check_pack

            name = check_pack(directory, origin=options["origin"]).manifest.get("name")
            built_against = online_digest(name) if isinstance(name, str) else None
        candidate = add_candidate(directory, origin=options["origin"], built_against=built_against, progress=self.progress)
        self.show_candidate(candidate)
        if candidate.state != PackCandidate.State.PASSED:
            raise CommandError(
                f"candidate_refused: {candidate.name or directory.name} did not pass the registry's checks ({self.refusal_codes(candidate)})"
            )

    def show_candidate(self, candidate: PackCandidate) -> None:
        self.stdout.write(f"candidate {candidate.digest}")
        self.stdout.write(f"  {candidate.name or '?'} {candidate.version}, {candidate.origin}, {candidate.state}")
        for finding in candidate.static_report:
            self.stdout.write(self.style.ERROR(f"  static  {finding['code']:<22} {finding['path'] or '(pack)'}: {finding['message']}"))
        honesty = candidate.honesty_report or {}
        for run in honesty.get("runs", []):
            self.stdout.write(f"  honesty {run['implementation']}: {sum(c['passed'] for c in run['cases'])}/{len(run['cases'])} cases, {run['steps']} steps traced")
            # why: the contract's own words (what could not run, each failed case's problems)
            for error in run.get("errors", []):
                self.stdout.write(self.style.ERROR(f"      could not run: {error}"))
            for case in run["cases"]:
                for failure in [] if case["passed"] else case.get("failures") or ["(no detail recorded)"]:
                    self.stdout.write(self.style.ERROR(f"      case {case['name']!r}: {failure}"))
        for finding in honesty.get("findings", []):
            self.stdout.write(self.style.ERROR(f"  honesty {finding['code']:<22} {finding['message']}"))

    @staticmethod
    def refusal_codes(candidate: PackCandidate) -> str:
        """The rule codes that refused ``candidate``, for the command's last line."""
        codes = [f["code"] for f in candidate.static_report] + [f["code"] for f in (candidate.honesty_report or {}).get("findings", [])]
        return ", ".join(dict.fromkeys(codes)) or "no rule code recorded"

    def do_publish(self, options: dict[str, Any]) -> None:
        prefix = str(options["digest"]).lower()
        matches = list(PackCandidate.objects.filter(digest__startswith=prefix).values_list("digest", flat=True)[:2]) if len(prefix) >= 8 else []
        if len(matches) != 1:
            raise CommandError("not_found: give a candidate's digest (or a unique prefix of 8 or more hex digits)")
        version = publish(matches[0], progress=self.progress)
        self.stdout.write(self.style.SUCCESS(f"{version.pack.name} {version.version} ({version.digest[:12]}) is online"))

    def do_revert(self, options: dict[str, Any]) -> None:
        previous = revert(options["name"], reason=options["reason"])
        if previous is None:
            self.stdout.write(self.style.SUCCESS(f"{options['name']}: its first version was taken back; the pack is removed"))
        else:
            self.stdout.write(self.style.SUCCESS(f"{options['name']}: back to {previous.version} ({previous.digest[:12]})"))

    def do_switch(self, options: dict[str, Any]) -> None:
        state = {"on": True, "off": False, "default": None}[options["state"]]
        set_enabled(options["name"], state)
        packs = load_packs()
        now = "on" if options["name"] in packs.packs else f"off ({packs.disabled.get(options['name'], 'not loaded')})"
        self.stdout.write(f"{options['name']}: switch {options['state']}; the pack is {now}")

    def do_grant(self, options: dict[str, Any]) -> None:
        for secret in options["secrets"]:
            row = grants.grant(options["name"], secret, origin=options["origin"], by="manage.py pack grant")
            self.stdout.write(f"{row.secret}: granted to the {row.origin} pack {row.pack_name}; its next host start gets it")

    def do_revoke(self, options: dict[str, Any]) -> None:
        for secret in options["secrets"]:
            row = grants.revoke(options["name"], secret, origin=options["origin"], by="manage.py pack revoke")
            self.stdout.write(
                f"{row.secret}: revoked for the {row.origin} pack {row.pack_name}; its next host start goes without it "
                "(a host running now keeps it until it stops)"
            )

    def do_grants(self, options: dict[str, Any]) -> None:
        rows = SecretGrant.objects.all()
        if options["name"]:
            rows = rows.filter(pack_name=options["name"])
        for row in rows:
            when = f"revoked {row.revoked_at:%Y-%m-%d %H:%M} by {row.revoked_by}" if not row.granted and row.revoked_at else (
                f"granted {row.granted_at:%Y-%m-%d %H:%M} by {row.granted_by}"
            )
            self.stdout.write(f"{row.pack_name:<16} {row.origin:<9} {row.secret:<24} {when}")

    def do_status(self, options: dict[str, Any]) -> None:
        record_shipped_versions()
        if options["name"]:
            self.show_pack(options["name"])
            return
        packs = load_packs()
        rows = [("PACK", "SOURCE", "STATE", "VERSION", "DIGEST", "MONITORING")]
        for entry in RegisteredPack.objects.select_related("active").order_by("name"):
            active = entry.active or entry.versions.filter(state=PackVersion.State.ACTIVE).first()
            if active is None:
                rows.append((entry.name, "-", "removed", "-", "-", "-"))
                continue
            state = "on" if entry.name in packs.packs else "refused" if entry.name in packs.refused else "off"
            monitoring = active.monitoring.get("action", "-") if active.monitoring else "-"
            rows.append((entry.name, active.origin, state, active.version, active.digest[:12], monitoring))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.stdout.write("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())

    def show_pack(self, name: str) -> None:
        entry = RegisteredPack.objects.filter(name=name).first()
        if entry is None:
            raise CommandError(f"not_found: there is no pack named {name!r}")
        switch = {True: "on", False: "off", None: "default"}[entry.enabled]
        self.stdout.write(f"{name}: switch {switch}; online {online_digest(name) or '(no published version)'}")
        self.show_secrets(name)
        for version in entry.versions.order_by("-activated_at"):
            end = f", {version.end_reason}" if version.end_reason else ""
            self.stdout.write(f"  {version.activated_at:%Y-%m-%d %H:%M} {version.origin:<9} {version.version:<8} {version.digest[:12]} {version.state}{end}")
            if version.monitoring:
                figures = version.monitoring
                self.stdout.write(f"      monitoring: {figures.get('action')}: {figures.get('reason', '')} (health {figures.get('health')})")
        for candidate in PackCandidate.objects.filter(name=name).order_by("-created_at")[:10]:
            self.stdout.write(f"  candidate {candidate.digest[:12]} {candidate.version} {candidate.origin} {candidate.state}")

    def show_secrets(self, name: str) -> None:
        """Each secret the loaded pack declares: granted to it, or not (its calls answer
        ``secret_not_granted``)."""
        pack = load_packs().packs.get(name)
        if pack is None or not pack.secrets:
            return
        origin = origin_of(pack.path, Path(settings.YIMI_PACKS_DIR))
        missing = set(grants.not_granted(name, pack.secrets, origin=origin))
        for secret in pack.secrets:
            state = f"{NOT_GRANTED} (manage.py pack grant {name} {secret})" if secret in missing else "granted"
            self.stdout.write(f"  secret {secret}: {state} ({origin})")

    def do_build(self, options: dict[str, Any]) -> None:
        try:
            from workshop.builds import build_candidate
        except ImportError as exc:
            raise CommandError(f"workshop_unavailable: the workshop's build_candidate is not there yet ({exc})") from None
        candidate = build_candidate(Path(options["source"]), progress=self.progress)
        self.show_candidate(candidate)
        if candidate.state != PackCandidate.State.PASSED:
            raise CommandError(f"candidate_refused: the build's candidate did not pass the registry's checks ({self.refusal_codes(candidate)})")
        self.stdout.write(f"publish it with: manage.py pack publish {candidate.digest[:16]}")
