"""Fake erasure: the real server's tools and receipts, against an in-memory timeline.

It loads ``server/tools.py`` and replaces its ``call`` with ``FakePlatform.call``, which
keeps a few timeline entries in memory and applies the platform's rules
(``memory.timeline.erasure``): criteria combined with AND (at least one), a digest over exactly the
selected set, an erase that compares the digest again and refuses a changed set
(``erasure_changed``), a replay by digest, and a result by token or id. Its tokens are not
signed (the fake holds no key). Entries: 1 "fake line one", 2 "fake line two" (with an
image), 3 "another fake line".
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import sys
import uuid
from pathlib import Path
from typing import Any

_SPEC = importlib.util.spec_from_file_location("yimi_pack_erasure_server_for_fake", Path(__file__).resolve().parent.parent / "server" / "tools.py")
assert _SPEC is not None and _SPEC.loader is not None
server = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = server
_SPEC.loader.exec_module(server)

TOOLS = server.TOOLS
NAMESPACE = uuid.UUID("0b8c2f4e-57a1-4f36-9d0e-6c1f3a2b9e71")
CREATED = "2026-01-01T00:00:00+00:00"


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class FakePlatform:
    def __init__(self) -> None:
        self.entries: dict[int, dict[str, Any]] = {
            1: {"kind": "utterance", "text": "fake line one", "image": None},
            2: {"kind": "image", "text": "fake line two", "image": "00000000-0000-4000-8000-000000000002"},
            3: {"kind": "reply", "text": "another fake line", "image": None},
        }
        self.erasures: dict[str, dict[str, Any]] = {}

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        try:
            handler = {"preview/": self.preview, "erase/": self.erase, "result/": self.result}.get(path)
            if handler is None or method != "POST":
                raise Refused(404, "not_found", "no such endpoint")
            return 200, handler(body or {})
        except Refused as exc:
            return exc.status, {"error": {"code": exc.code, "message": exc.message}}

    @staticmethod
    def criteria(body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise Refused(400, "invalid_request", "expected a JSON object")
        seqs, text = body.get("seqs") or [], body.get("text") or ""
        if not isinstance(seqs, list) or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in seqs):
            raise Refused(400, "invalid_request", "seqs must be a list of positive timeline numbers")
        if not isinstance(text, str) or (text and len(text.strip()) < 2):
            raise Refused(400, "invalid_request", "text must be 2 to 500 characters")
        if body.get("after") or body.get("before"):
            raise Refused(400, "invalid_request", "the fake keeps no times: use seqs or text")
        if not seqs and not text:
            raise Refused(400, "invalid_request", "give timeline numbers (seqs), a time range (after/before) or a text to match")
        return {"seqs": sorted(set(seqs)), "after": None, "before": None, "text": text.strip()}

    def select(self, criteria: dict[str, Any]) -> tuple[list[int], str]:
        seqs = [
            seq for seq, e in sorted(self.entries.items())
            if e["text"] and (not criteria["seqs"] or seq in criteria["seqs"]) and criteria["text"].lower() in e["text"].lower()
        ]
        digest = hashlib.sha256()
        for seq in seqs:
            e = self.entries[seq]
            digest.update(f"{seq}:{hashlib.sha256(e['text'].encode()).hexdigest()}:{e['image'] or ''}\n".encode())
        return seqs, digest.hexdigest()

    def preview(self, body: dict[str, Any]) -> dict[str, Any]:
        criteria = self.criteria(body)
        seqs, digest = self.select(criteria)
        token = base64.urlsafe_b64encode(json.dumps({"c": criteria, "d": digest}).encode()).decode()
        entries = [{"seq": s, "kind": self.entries[s]["kind"], "created_at": CREATED, "excerpt": self.entries[s]["text"][:80],
                    "truncated": False, "image_id": self.entries[s]["image"]} for s in seqs]
        images = sorted(self.entries[s]["image"] for s in seqs if self.entries[s]["image"])
        return {"preview_token": token, "digest": digest, "count": len(seqs), "entries": entries, "images": images,
                "embeddings": len(seqs), "criteria": criteria, "expires_in_seconds": 600}

    @staticmethod
    def token(value: Any) -> dict[str, Any]:
        try:
            claims = json.loads(base64.urlsafe_b64decode(str(value).encode()))
        except ValueError:
            raise Refused(400, "invalid_request", "this is not a preview token") from None
        if not isinstance(claims, dict) or "d" not in claims:
            raise Refused(400, "invalid_request", "this is not a preview token")
        return claims

    def erase(self, body: dict[str, Any]) -> dict[str, Any]:
        claims = self.token(body.get("preview_token"))
        if claims["d"] in self.erasures:
            return {**self.erasures[claims["d"]], "replayed": True}
        seqs, digest = self.select(self.criteria(claims["c"]))
        if digest != claims["d"]:
            raise Refused(409, "erasure_changed", "what these criteria select changed since the preview: nothing was erased; preview again")
        if not seqs:
            raise Refused(409, "nothing_to_erase", "the preview selected no entries: nothing was erased")
        images = sorted(self.entries[s]["image"] for s in seqs if self.entries[s]["image"])
        result = {"erasure_id": str(uuid.uuid5(NAMESPACE, f"fake:{digest}")), "digest": digest, "erased_at": CREATED,
                  "entries": [{"seq": s, "kind": self.entries[s]["kind"], "created_at": CREATED} for s in seqs],
                  "images": images, "embeddings": len(seqs), "redacted": {}, "not_erased": ["nothing: this is the fake"], "replayed": False}
        for s in seqs:
            self.entries[s].update(text="", image=None)
        self.erasures[digest] = result
        return result

    def result(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("preview_token"):
            found = self.erasures.get(self.token(body["preview_token"])["d"])
        else:
            found = next((r for r in self.erasures.values() if r["erasure_id"] == body.get("erasure_id")), None)
        if found is None:
            raise Refused(404, "not_found", "no erasure was made from this")
        return {**found, "replayed": False}


PLATFORM = FakePlatform()
server.call = PLATFORM.call
