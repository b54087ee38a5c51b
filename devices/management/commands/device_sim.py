"""``manage.py device_sim``: a simulated device speaking the real protocol.

    device_sim pair CODE --key-file phone.json [--kind phone] [--name ...] [--server URL]
    device_sim say "hello" --key-file phone.json     # prints reply chunks as they arrive, ACKs
    device_sim sync --key-file phone.json [--after N]
    device_sim chat --key-file phone.json            # one line in, one reply out
    device_sim approve [CARD_ID] --key-file phone.json  # answer a consent or payment card
    device_sim deny [CARD_ID] --key-file phone.json     # (say prints cards and their ids)
    device_sim confirm-draft DRAFT_ID --key-file phone.json  # confirm a model draft (Face ID, simulated)
    device_sim photo FILE [--ask "看看这是什么"] --key-file glasses.json  # upload a JPEG/PNG, announce it, ask about it
    device_sim mac --sandbox DIR --key-file mac.json   # the Mac: stay connected, run Yimi's operations inside DIR only
    device_sim pause-mac on|off --key-file phone.json  # pause/resume Yimi's Mac operations (phone, or the Mac's hotkey)

``--server`` defaults to ``http://YIMI_HOST:YIMI_PORT`` (where ``./yimi up`` serves). Every
error is one line saying what to do (``CommandError``), never a traceback.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import websockets
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from brain.agent_loop import DELEGATED_ACK
from devices.consumers.connection import CLOSE_AUTH_FAILED, CLOSE_REVOKED
from devices.mac.crypto import pause_message
from devices.mac.sandbox import MacSandbox
from devices.mac.sim import MacAgent
from devices.mac.sim import serve as mac_serve
from devices.simulator import (
    ConnectionLost,
    DeviceConnection,
    DeviceIdentity,
    SimulatorError,
    card_id,
    card_lines,
    pair,
    timeline_line,
    upload_image,
)

FOLLOW_SECONDS = 30.0  # how long `say` and `approve` wait for what follows


class Command(BaseCommand):
    help = "Simulate a paired device: pair, say something, sync the timeline, or chat."

    def add_arguments(self, parser: Any) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        p = sub.add_parser("pair", help="pair with a pairing code")
        p.add_argument("code")
        p.add_argument("--kind", default="phone", choices=["phone", "watch", "mac", "glasses"])
        p.add_argument("--name", default=None)
        p.add_argument("--channels", default=None, help="comma-separated capture channels")
        p.add_argument("--relay-via", default=None, help="a watch's phone (device id)")
        p.add_argument(
            "--server",
            default=default_server(),
            help="the Yimi server, with its scheme (default: http://YIMI_HOST:YIMI_PORT, as ./yimi up serves: %(default)s)",
        )
        s = sub.add_parser("say", help="send one text and print the reply")
        s.add_argument("text")
        y = sub.add_parser("sync", help="print the timeline after a sequence number")
        y.add_argument("--after", type=int, default=0)
        sub.add_parser("chat", help="interactive: type lines, read replies")
        for sp in (p, s, y, sub.choices["chat"]):
            sp.add_argument("--key-file", required=True, help="where this device's identity and key are kept")
        s.add_argument("--follow", type=float, default=None, help="seconds to wait for cards and the report after the reply "
                       f"(default: {FOLLOW_SECONDS:g} when Yimi delegated the work, else 0)")
        for answer in ("approve", "deny"):
            a = sub.add_parser(answer, help=f"{answer} a consent or payment card (the only open one, or CARD_ID)")
            a.add_argument("card_id", nargs="?", default=None, help="the card's id (or its start), as `say` prints it")
            a.add_argument("--key-file", required=True, help="where this device's identity and key are kept")
            a.add_argument("--follow", type=float, default=FOLLOW_SECONDS,
                           help="seconds to wait for what follows: the report after approving, the acknowledgement after denying")

        ph = sub.add_parser("photo", help="send a photo (JPEG or PNG) as the glasses do, then ask about it")
        ph.add_argument("file", help="the image file")
        ph.add_argument("--ask", default="看看这是什么", help="what to ask about it (empty: only send the photo)")
        ph.add_argument("--key-file", required=True, help="where this device's identity and key are kept")

        m = sub.add_parser("mac", help="be the owner's Mac: stay connected and run Yimi's operations inside a sandbox directory")
        m.add_argument("--sandbox", required=True, help="the only directory operations may touch")
        m.add_argument("--key-file", required=True, help="where this device's identity and key are kept (a paired mac)")
        m.add_argument("--seconds", type=float, default=None, help="stop after this long (default: run until interrupted)")
        pm = sub.add_parser("pause-mac", help="pause (on) or resume (off) Yimi's operations on the owner's Mac")
        pm.add_argument("state", choices=["on", "off"])
        pm.add_argument("--key-file", required=True, help="the owner's phone or Mac")

        c = sub.add_parser("confirm-draft", help="confirm a model-settings draft, as the phone does after Face ID")
        c.add_argument("draft_id", help="the draft's id (or its start), as the console shows it")
        c.add_argument("--key-file", required=True, help="where this device's identity and key are kept")

    def handle(self, *args: Any, **opts: Any) -> None:
        where = default_server()
        if opts["action"] == "pair":
            opts["server"] = checked_server(opts["server"])
            where = opts["server"]
        elif opts.get("key_file"):
            where = load_identity(Path(opts["key_file"])).server
        if opts.get("key_file"):
            self.key_file = f"--key-file {opts['key_file']}"  # in the commands a card prints
        try:
            asyncio.run(getattr(self, f"_{opts['action'].replace('-', '_')}")(opts))
        except (httpx.ConnectError, httpx.ConnectTimeout, ConnectionRefusedError, TimeoutError) as exc:
            raise CommandError(f"cannot reach Yimi at {where}: is `./yimi up` running there? ({type(exc).__name__})") from exc
        except ConnectionLost as exc:
            raise CommandError(closed_message(exc.code, exc.reason)) from exc
        except websockets.ConnectionClosed as exc:
            raise CommandError(closed_message(exc.rcvd.code if exc.rcvd else None, exc.rcvd.reason if exc.rcvd else "")) from exc
        except (SimulatorError, OSError, httpx.HTTPError, websockets.WebSocketException) as exc:
            raise CommandError(f"{exc} (server {where})") from exc

    async def _pair(self, opts: dict[str, Any]) -> None:
        path = Path(opts["key_file"])
        if path.exists():
            raise CommandError(f"{path} exists: this device is already paired (use another --key-file)")
        default_channels = {"phone": "phone_app", "watch": "watch", "mac": "mac", "glasses": "glasses"}
        channels = (opts["channels"] or default_channels[opts["kind"]]).split(",")
        identity = await pair(
            opts["server"],
            opts["code"],
            kind=opts["kind"],
            name=opts["name"] or f"simulated {opts['kind']}",
            capture_channels=[c.strip() for c in channels if c.strip()],
            relay_via=opts["relay_via"],
        )
        identity.save(path)
        self.stdout.write(f"paired {identity.kind} {identity.device_id}; key kept in {path} (0600)")

    async def _photo(self, opts: dict[str, Any]) -> None:
        """Upload the file, announce it with an ``image`` frame linked (``about``) to the
        question that follows, then ask and print the reply."""
        path = Path(opts["file"])
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CommandError(f"cannot read the photo {path}: {exc.strerror or exc} (give a JPEG or PNG file)") from None
        content_type = "image/png" if data.startswith(b"\x89PNG") else "image/jpeg"
        identity = load_identity(Path(opts["key_file"]))
        uploaded = await upload_image(identity, data, content_type)
        self.stdout.write(f"uploaded {path.name}: {uploaded['width']}×{uploaded['height']} {uploaded['content_type']}, "
                          f"image {uploaded['image_id']}")
        question_id = uuid.uuid4().hex if opts["ask"] else None
        async with DeviceConnection(identity) as conn:
            ack = await conn.send_image(uploaded["image_id"], about=question_id)
            self.stdout.write(f"[#{ack['seq']}] photo on the timeline")
            if opts["ask"]:
                self.follow = 0.0
                await self._exchange(conn, opts["ask"], client_id=question_id)

    async def _say(self, opts: dict[str, Any]) -> None:
        self.follow = opts["follow"]
        async with DeviceConnection(load_identity(Path(opts["key_file"]))) as conn:
            await self._exchange(conn, opts["text"])

    async def _exchange(self, conn: DeviceConnection, text: str, *, client_id: str | None = None) -> None:
        ack = await conn.say(text, client_id)
        self.stdout.write(f"[#{ack['seq']}] you: {text}")
        self.stdout.write("yimi: ", ending="")
        self.stdout.flush()

        def show(chunk: str) -> None:
            self.stdout.write(chunk, ending="")
            self.stdout.flush()

        _, final = await conn.reply_to(ack["seq"], timeout=120, on_chunk=show)
        if final["type"] == "notice":
            self.stdout.write(f"\n[#{final['seq']}] notice ({final['code']}): {final['text']}")
        else:
            self.stdout.write(f"\n[#{final['seq']}] (rendered, ACK sent)")
        await conn.ack(final["seq"], "rendered")
        follow = self.follow if self.follow is not None else (FOLLOW_SECONDS if final.get("text") == DELEGATED_ACK else 0.0)
        for card in conn.cards.values():
            self._show_card(card)
        if follow:
            await self._follow(conn, ack["seq"], follow, until_card=True)
        await asyncio.sleep(0.05)  # let the ACK frame leave before the socket closes

    # --- cards: `say` prints them, `approve`/`deny` answer them -------------------------------

    follow: float | None = None

    key_file = "--key-file ..."

    def _show_card(self, card: dict[str, Any]) -> None:
        """The card as a person reads it (``simulator.card_lines``), with the commands that answer it."""
        for line in card_lines(card, answer_with=self.key_file):
            self.stdout.write(line)

    async def _follow(self, conn: DeviceConnection, seq: int, seconds: float, *, until_card: bool = False) -> None:
        """Print what follows an utterance (activity, cards, the report) until its report
        arrives, a card asks for an answer (``until_card``), or ``seconds`` pass quietly."""
        last_activity: tuple[Any, ...] = ()
        while True:
            try:
                frame = await conn.next_frame("activity", "consent.card", "payment.card", "reply.done", "notice", timeout=seconds)
            except SimulatorError:
                return
            if frame["type"] == "activity":
                # A task's card is updated per receipt and once more when the task ends (often
                # with the same receipt): print each new state of it once, with what it did.
                facts = list(frame.get("facts") or [])
                shown = (frame.get("task_id"), frame["status"], tuple(facts))
                if shown != last_activity:
                    last_activity = shown
                    detail = f" — {facts[1]}" if len(facts) > 1 else ""
                    self.stdout.write(f"[activity] {frame['title']}: {frame['status']}{detail}")
            elif frame["type"] in ("consent.card", "payment.card"):
                self._show_card(frame)
                if until_card:
                    return
            elif frame.get("reply_to_seq") == seq:
                self.stdout.write(f"[#{frame['seq']}] yimi: {frame['text']}")
                await conn.ack(frame["seq"], "rendered")
                return

    async def _approve(self, opts: dict[str, Any]) -> None:
        await self._answer(opts, "approve")

    async def _deny(self, opts: dict[str, Any]) -> None:
        await self._answer(opts, "deny")

    async def _answer(self, opts: dict[str, Any], answer: str) -> None:
        async with DeviceConnection(DeviceIdentity.load(Path(opts["key_file"]))) as conn:
            cards = await conn.open_cards()
            wanted = opts["card_id"]
            matching = [c for c in cards if not wanted or card_id(c).startswith(wanted)]
            if not cards:
                raise CommandError("no open card to answer (a consent or payment card opens when Yimi asks)")
            if len(matching) != 1:
                listed = ", ".join(card_id(c) for c in cards)
                which = f"no open card {wanted}" if wanted and not matching else "more than one open card: name one"
                raise CommandError(f"{which} (open cards: {listed})")
            card = matching[0]
            result = await conn.answer_card(card, answer)
            self.stdout.write(f"[card {card_id(card)}] {answer}: {result['state']}")
            run_seq = await self._utterance_of(conn)
            if opts["follow"] and run_seq is not None:  # the report, or the acknowledgement of a deny
                await self._follow(conn, run_seq, opts["follow"])
            await asyncio.sleep(0.05)

    async def _confirm_draft(self, opts: dict[str, Any]) -> None:
        async with DeviceConnection(load_identity(Path(opts["key_file"]))) as conn:
            drafts = await conn.model_drafts()
            matching = [d for d in drafts if d["id"].startswith(opts["draft_id"])]
            if len(matching) != 1:
                listed = ", ".join(d["id"] for d in drafts) or "none"
                which = "more than one draft starts so: give more of its id" if matching else f"no open, probed draft {opts['draft_id']}"
                raise CommandError(f"{which} (drafts to confirm: {listed})")
            draft = matching[0]
            probe = draft["probe"]
            self.stdout.write(f"draft {draft['id']}: {draft['role']} → {draft['provider']} {draft['model']} at {draft['base_url']} "
                              f"(key: {draft['key']}; probe: {probe['status']}{' ' + probe['error_code'] if probe['error_code'] else ''})")
            result = await conn.confirm_draft(draft)
            self.stdout.write(f"confirmed: {result['role']} is now version {result['version']}; it takes effect from the next run")

    async def _mac(self, opts: dict[str, Any]) -> None:
        """The simulated Mac (devices/mac/sim.py): operations run inside ``--sandbox`` only."""
        identity = load_identity(Path(opts["key_file"]))
        if identity.kind != "mac":
            raise CommandError(f"{opts['key_file']} is a {identity.kind}: pair a device with --kind mac")
        sandbox = MacSandbox(Path(opts["sandbox"]))
        agent = MacAgent(identity.device_id, identity.key, identity.instance_public_key, sandbox)
        async with DeviceConnection(identity) as conn:
            self.stdout.write(f"connected as {identity.name}; operations run inside {sandbox.root} (Ctrl-C stops)")
            await mac_serve(conn, agent, on_event=lambda text: self.stdout.write(text), seconds=opts["seconds"])

    async def _pause_mac(self, opts: dict[str, Any]) -> None:
        identity = load_identity(Path(opts["key_file"]))
        paused = opts["state"] == "on"
        async with DeviceConnection(identity) as conn:
            request_id = uuid.uuid4().hex
            await conn.send({"type": "mac.pause", "id": request_id, "paused": paused,
                             "signature": identity.sign(pause_message(identity.device_id, conn.nonce, paused))})
            while True:
                frame = await conn.next_frame("mac.pause.ok", "error")
                if frame.get("id") == request_id:
                    break
        if frame["type"] == "error":
            raise CommandError(f"{frame['code']}: {frame['message']}")
        self.stdout.write(f"Yimi's Mac operations are {'paused' if frame['paused'] else 'running'} (since {frame['changed_at']})")

    async def _utterance_of(self, conn: DeviceConnection) -> int | None:
        """The report of an approved card answers the utterance that asked for it: the
        latest utterance of this device."""
        for entry in reversed(await conn.sync(after=max(conn.ready.get("last_seq", 0) - 50, 0))):
            if entry["kind"] == "utterance" and entry["device_id"] == conn.identity.device_id:
                return int(entry["seq"])
        return None

    async def _sync(self, opts: dict[str, Any]) -> None:
        async with DeviceConnection(load_identity(Path(opts["key_file"]))) as conn:
            for entry in await conn.sync(after=opts["after"]):
                self.stdout.write(timeline_line(entry))

    async def _chat(self, opts: dict[str, Any]) -> None:
        async with DeviceConnection(load_identity(Path(opts["key_file"]))) as conn:
            self.stdout.write(f"connected as {conn.identity.name}; type a line, Ctrl-D to quit")
            # stdin is read by a daemon thread, so a connection the server closes (the device
            # revoked, the server stopped) ends the chat at once, not at the next line typed.
            loop = asyncio.get_running_loop()
            lines: asyncio.Queue[str] = asyncio.Queue()

            def read_stdin() -> None:
                try:
                    for line in iter(sys.stdin.readline, ""):
                        loop.call_soon_threadsafe(lines.put_nowait, line)
                    loop.call_soon_threadsafe(lines.put_nowait, "")
                except RuntimeError:  # the chat ended (its loop closed) while a line was read
                    return

            threading.Thread(target=read_stdin, name="device-sim-stdin", daemon=True).start()
            assert conn.closed is not None
            closed: asyncio.Future[Any] = conn.closed
            while True:
                next_line: asyncio.Future[Any] = asyncio.ensure_future(lines.get())
                await asyncio.wait({next_line, closed}, return_when=asyncio.FIRST_COMPLETED)
                if not next_line.done():
                    next_line.cancel()
                    raise ConnectionLost(*conn.closed.result())
                line = next_line.result()
                if not line:
                    return
                if line.strip():
                    await self._exchange(conn, line.strip())


def default_server() -> str:
    """``http://YIMI_HOST:YIMI_PORT``: the address ``./yimi up`` serves on."""
    host = settings.YIMI_HOST
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    return f"http://{host}:{settings.YIMI_PORT}"


def checked_server(server: str) -> str:
    """``server`` without a trailing slash, if it is an http(s) URL with a host (a ws:// or
    wss:// URL names the same server: it becomes http:// or https://)."""
    parts = urlsplit(server)
    if parts.scheme in ("ws", "wss") and parts.netloc:
        return f"{'https' if parts.scheme == 'wss' else 'http'}://{parts.netloc}"
    if parts.scheme not in ("http", "https") or not parts.netloc:
        example = f"http://{parts.netloc}" if parts.netloc else f"http://{server or '127.0.0.1:8000'}"
        raise CommandError(f"--server {server!r} needs its scheme and host, e.g. --server {example}")
    return server.rstrip("/")


def load_identity(path: Path) -> DeviceIdentity:
    """The device identity kept in ``path``, or one line saying to pair first."""
    try:
        return DeviceIdentity.load(path)
    except FileNotFoundError:
        raise CommandError(
            f"no device identity in {path}: pair first (manage.py device_sim pair CODE --key-file {path})"
        ) from None
    except (OSError, ValueError, TypeError) as exc:
        raise CommandError(f"{path} is not a device_sim key file ({exc}): pair again with another --key-file") from None


def closed_message(code: int | None, reason: str) -> str:
    if code == CLOSE_REVOKED:
        return "the server closed the connection: this device was revoked by its owner (pair again with a new code)"
    if code == CLOSE_AUTH_FAILED:
        return "the server refused this device (unknown or revoked): pair again with a new code"
    return f"the connection to Yimi closed (code {code}{': ' + reason if reason else ''}): is the server still running?"
