"""A local miIO device server for tests: real UDP, the real wire format, a few devices.

Each ``FakeMiioDevice`` binds its own loopback address on UDP port 54321 (the miIO port;
python-miio always sends there), so several devices live side by side on 127.x.y.z.
Written from the protocol, not from python-miio, so a test that passes shows both sides
agree on the bytes:

- a packet is a 32-byte header — magic ``0x2131`` (2 bytes), total length (2), unknown (4:
  ``0xffffffff`` in a hello, else 0), device id (4), stamp (4, seconds), checksum (16) —
  then the encrypted JSON;
- the hello is exactly ``21 31 00 20`` followed by 28 ``ff``; the answer is a bare header
  carrying the device id and stamp (checksum ``ff``: a provisioned device keeps its token);
- encryption: AES-128-CBC, PKCS#7, key = MD5(token), iv = MD5(key + token);
- checksum: MD5(header's first 16 bytes + token + encrypted body).

A packet whose checksum does not verify under the device's token (a wrong token) is dropped
without an answer, as a real device does; ``rejected`` counts them. Requests are
``{"id", "method", "params"}``; answers ``{"id", "result"}`` or ``{"id", "error": {"code",
"message"}}``. ``calls`` records every method that was executed.
"""

from __future__ import annotations

import hashlib
import json
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

MIIO_PORT = 54321
HELLO = bytes.fromhex("21310020" + "ff" * 28)


def key_iv(token: bytes) -> tuple[bytes, bytes]:
    key = hashlib.md5(token).digest()  # noqa: S324 - the protocol's key derivation
    return key, hashlib.md5(key + token).digest()  # noqa: S324


def encrypt(token: bytes, plain: bytes) -> bytes:
    key, iv = key_iv(token)
    padder = padding.PKCS7(128).padder()
    data = padder.update(plain) + padder.finalize()
    enc = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
    return enc.update(data) + enc.finalize()


def decrypt(token: bytes, data: bytes) -> bytes:
    key, iv = key_iv(token)
    dec = Cipher(algorithms.AES(key), modes.CBC(iv)).decryptor()
    padded = dec.update(data) + dec.finalize()
    unpadder = padding.PKCS7(128).unpadder()
    return unpadder.update(padded) + unpadder.finalize()


def packet(token: bytes, device_id: int, stamp: int, payload: dict[str, Any]) -> bytes:
    body = encrypt(token, json.dumps(payload).encode() + b"\x00")
    head = struct.pack(">HHIII", 0x2131, 32 + len(body), 0, device_id, stamp)
    checksum = hashlib.md5(head + token + body).digest()  # noqa: S324
    return head + checksum + body


@dataclass
class FakeMiioDevice:
    """One device: ``kind`` lamp, plug or lock; ``token`` 32 hex digits."""

    kind: str
    model: str
    token_hex: str = field(default_factory=lambda: f"{random.getrandbits(128):032x}")
    device_id: int = field(default_factory=lambda: random.randint(0x01000000, 0x7FFFFFFF))
    state: dict[str, Any] = field(default_factory=dict)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    rejected: int = 0
    host: str = ""
    started: float = field(default_factory=time.monotonic)

    @property
    def token(self) -> bytes:
        return bytes.fromhex(self.token_hex)

    def stamp(self) -> int:
        return 1000 + int(time.monotonic() - self.started)

    def handle(self, data: bytes) -> bytes | None:
        if data == HELLO:
            head = struct.pack(">HHIII", 0x2131, 32, 0, self.device_id, self.stamp())
            return head + b"\xff" * 16
        if len(data) < 32 or data[:2] != b"\x21\x31":
            return None
        length, _unknown, _did, _stamp = struct.unpack(">HIII", data[2:16])
        body = data[32:length]
        if hashlib.md5(data[:16] + self.token + body).digest() != data[16:32]:  # noqa: S324
            self.rejected += 1  # a wrong token: dropped, no answer (as a real device)
            return None
        try:
            request = json.loads(decrypt(self.token, body).rstrip(b"\x00"))
        except ValueError:
            self.rejected += 1
            return None
        answer = self.execute(str(request.get("method")), request.get("params") or [])
        return packet(self.token, self.device_id, self.stamp(), {"id": request.get("id"), **answer})

    def execute(self, method: str, params: Any) -> dict[str, Any]:
        self.calls.append((method, params))
        if method == "miIO.info":
            return {"result": {"model": self.model, "fw_ver": "1.0.0_fake", "mac": "02:00:00:{:02x}:{:02x}:{:02x}".format(*tuple(self.device_id.to_bytes(4, "big")[1:])),
                               "did": str(self.device_id)}}
        if method == "get_prop":
            return {"result": [self.state.get(str(name)) for name in params]}
        setter = {"set_power": "power", "set_bright": "bright", "set_ct_abx": "ct", "set_lock": "lock_state"}.get(method)
        if setter is None or setter not in self.state:
            return {"error": {"code": -5001, "message": f"method {method} not supported"}}
        self.state[setter] = params[0] if params else None
        return {"result": ["ok"]}


class FakeMiioHome:
    """Runs devices, each on its own loopback address and UDP port 54321, in one thread."""

    def __init__(self, devices: dict[str, FakeMiioDevice]) -> None:
        self.devices = devices
        self._sockets: dict[socket.socket, FakeMiioDevice] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def standard(cls) -> FakeMiioHome:
        """A lamp, a plug and a door lock."""
        return cls({
            "lamp": FakeMiioDevice("lamp", "yeelink.light.lamp1", state={"power": "off", "bright": 50, "ct": 4000}),
            "plug": FakeMiioDevice("plug", "chuangmi.plug.m1", state={"power": "on"}),
            "lock": FakeMiioDevice("lock", "lumi.lock.mcn01", state={"lock_state": "locked", "battery": 87}),
        })

    def __enter__(self) -> FakeMiioHome:
        for name, device in self.devices.items():
            for _ in range(20):
                host = f"127.{random.randint(1, 254)}.{random.randint(0, 254)}.{random.randint(2, 254)}"
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                try:
                    sock.bind((host, MIIO_PORT))
                except OSError:
                    sock.close()
                    continue
                sock.settimeout(0.2)
                device.host = host
                self._sockets[sock] = device
                break
            else:
                raise RuntimeError(f"no free loopback address for {name}")
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for sock in self._sockets:
            sock.close()

    def _serve(self) -> None:
        import selectors

        selector = selectors.DefaultSelector()
        for sock in self._sockets:
            selector.register(sock, selectors.EVENT_READ)
        while not self._stop.is_set():
            for key, _ in selector.select(timeout=0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data, peer = sock.recvfrom(4096)
                except OSError:
                    continue
                answer = self._sockets[sock].handle(data)
                if answer is not None:
                    sock.sendto(answer, peer)
        selector.close()

    def secret(self, *, tokens: dict[str, str] | None = None) -> str:
        """The ``MIJIA_DEVICES`` secret for these devices (``tokens`` overrides some)."""
        names = {"lamp": "台灯", "plug": "插座", "lock": "门锁"}
        return json.dumps([
            {"name": names.get(key, key), "kind": d.kind, "host": d.host, "token": (tokens or {}).get(key, d.token_hex)}
            for key, d in self.devices.items()
        ], ensure_ascii=False)
