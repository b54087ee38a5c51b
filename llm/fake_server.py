"""The demo brain: a small OpenAI-compatible Chat Completions server with scripted,
deterministic answers. Used by the tests, the benchmark, and the embedded default when
no brain is configured. Every default answer says plainly that it is the demo brain.

A script is a JSON list of rules, tried in order against the last user message:

    [{"match": "weather", "reply": "Sunny.", "chunk_chars": 4, "delay_ms": 0},
     {"match": "fail", "status": 500},
     {"match": "slow", "hang_seconds": 30},
     {"match": "cut", "reply": "half an ans", "truncate": true}]

A rule without ``match`` matches everything. With no matching rule the demo reply is
used. ``{text}`` in a reply, and in the string values of its tool calls' arguments, is
replaced by the user's message.

``Script.load("demo")`` loads the bundled demo script (``llm/scripts/demo.json``), which
walks the real paths: remembering (memory__commit), a first send to Alice (a consent card)
and buying a milk tea (a payment card); README.md, "Try it", shows it.

Rules can script an agent loop: ``tool_calls`` ([{"name", "arguments"}]) are returned
as streamed tool-call fragments; ``when`` says which message the rule looks at —
``"user"`` (default: the last message is the user's), ``"tool"`` (the last message is a
tool result; ``match`` is tried on its content) or ``"any"``; ``requires_tool`` /
``forbids_tool`` make a rule apply only when the request offers (or does not offer) a
tool of that name, which tells a main agent from a sub-agent.

Usage: when a streaming request asks for it (``stream_options.include_usage``), the last
event before ``[DONE]`` carries an OpenAI-shaped ``usage`` object with ``choices: []``:
``prompt_tokens`` = the characters of the request's message contents / 4 (rounded up),
``completion_tokens`` = the characters of the reply and tool-call arguments / 4 (rounded
up), ``prompt_tokens_details.cached_tokens`` = 0. A rule's ``usage`` replaces that object
(a dict) or leaves it out (``false``); a server started with ``report_usage=False``
(``fake_brain --no-usage``) never sends one, like a provider that does not report usage.

Images: a user message whose content is a list of parts (OpenAI-compatible vision
content) is matched on its text parts; when no rule matches a request carrying an
``image_url`` data URI, the demo brain says plainly what it received (the image's size,
read with Pillow) and that it cannot see it (``DEMO_IMAGE_REPLY``).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import json
import math
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"
DEMO_REPLY = "[demo brain] You said: “{text}”. I am Yimi's demo brain, not a real model. To use one, see \"Use a real model\" in the README (manage.py model_settings draft brain)."
DEMO_IMAGE_REPLY = (
    "[demo brain] I received an image of {width}×{height} ({format}, {size} bytes) with your words “{text}”. "
    "I can't see it: I am not a model. Set the vision role to a real model to have images described."
)


@dataclass
class Rule:
    match: str | None = None
    reply: str = DEMO_REPLY
    status: int = 200
    chunk_chars: int = 8
    delay_ms: int = 0
    hang_seconds: float = 0.0
    truncate: bool = False
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    when: str = "user"
    requires_tool: str | None = None
    forbids_tool: str | None = None
    usage: bool | dict[str, Any] = True

    def applies(self, body: dict[str, Any]) -> bool:
        messages = body.get("messages") or []
        offered = {t.get("function", {}).get("name") for t in body.get("tools") or []}
        if self.requires_tool and self.requires_tool not in offered:
            return False
        if self.forbids_tool and self.forbids_tool in offered:
            return False
        last = messages[-1] if messages else {}
        if self.when == "any":
            text = _last_user_text(messages)
        elif last.get("role") == self.when:
            text = _content_text(last.get("content"))
        else:
            return False
        return self.match is None or re.search(self.match, text, re.I) is not None


@dataclass
class Script:
    rules: list[Rule] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)  # what was asked, for tests

    @classmethod
    def load(cls, path: str | Path | None) -> Script:
        if not path:
            return cls()
        if str(path) == "demo":
            path = SCRIPTS_DIR / "demo.json"
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(rules=[Rule(**r) for r in raw])

    def scripted_rule(self, body: dict[str, Any]) -> Rule | None:
        return next((r for r in self.rules if r.applies(body)), None)


def _fill(value: Any, text: str) -> Any:
    """``value`` with ``{text}`` in every string replaced by the user's message."""
    if isinstance(value, str):
        return value.replace("{text}", text)
    if isinstance(value, list):
        return [_fill(v, text) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, text) for k, v in value.items()}
    return value


def _content_text(content: Any) -> str:
    """A message's text: the string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user" and isinstance(message.get("content"), str | list):
            return _content_text(message["content"])
    return ""


def image_summary(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The last user message's image (a ``data:`` URI): its format, size in pixels and
    bytes, read with Pillow; None when there is no image (or it is not a data URI)."""
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        parts = message.get("content") if isinstance(message.get("content"), list) else []
        for part in parts:
            url = part.get("image_url", {}).get("url", "") if isinstance(part, dict) and part.get("type") == "image_url" else ""
            if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
                continue
            try:
                data = base64.b64decode(url.split(";base64,", 1)[1], validate=True)
                with Image.open(io.BytesIO(data)) as image:
                    return {"width": image.width, "height": image.height, "format": (image.format or "?").lower(), "size": len(data)}
            except (binascii.Error, ValueError, UnidentifiedImageError, OSError):
                return {"width": "?", "height": "?", "format": "unreadable", "size": len(url)}
        return None
    return None


class _Handler(BaseHTTPRequestHandler):
    server: FakeBrainServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # each event leaves when written, as from a provider's edge

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._json(200, {"object": "list", "data": [{"id": "yimi-demo", "object": "model"}]})
        else:
            self._json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._json(404, {"error": {"message": "not found"}})
            return
        length = int(self.headers.get("Content-Length", "0"))
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            messages = body["messages"]
        except (ValueError, KeyError):
            self._json(400, {"error": {"message": "invalid request"}})
            return
        self.server.script.requests.append(body)
        text = _last_user_text(messages)
        scripted = self.server.script.scripted_rule(body)
        image = image_summary(messages) if scripted is None else None
        rule = scripted or (Rule(when="any", reply=DEMO_IMAGE_REPLY.format(**image, text="{text}")) if image else Rule(when="any"))
        if rule.hang_seconds:
            time.sleep(rule.hang_seconds)
        if rule.status != 200:
            self._json(rule.status, {"error": {"message": "scripted failure"}})
            return
        reply = rule.reply.replace("{text}", text)
        tool_calls = _fill(rule.tool_calls, text)
        if body.get("stream"):
            self._stream(reply, rule, tool_calls, self._usage(body, rule, reply, tool_calls))
        else:
            self._json(200, _completion(reply, tool_calls))

    def _usage(self, body: dict[str, Any], rule: Rule, reply: str, tool_calls: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The usage object for the stream's last event, or None (not asked for, not reported)."""
        options = body.get("stream_options")
        if not (isinstance(options, dict) and options.get("include_usage")) or not self.server.report_usage or rule.usage is False:
            return None
        if isinstance(rule.usage, dict):
            return rule.usage
        prompt = sum(len(_content_text(m.get("content"))) for m in body.get("messages") or [])
        completion = len(reply) + sum(len(json.dumps(c.get("arguments", {}), ensure_ascii=False)) for c in tool_calls)
        prompt_tokens, completion_tokens = math.ceil(prompt / 4), math.ceil(completion / 4)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": 0}}

    def _stream(self, reply: str, rule: Rule, tool_calls: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        # As providers stream: chunked, and the connection stays open for the next request.
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        ident = f"chatcmpl-{uuid.uuid4().hex[:12]}"
        pieces = [reply[i : i + rule.chunk_chars] for i in range(0, len(reply), max(rule.chunk_chars, 1))]
        for piece in pieces:
            self._event({"id": ident, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
            if rule.delay_ms:
                time.sleep(rule.delay_ms / 1000)
        for index, call in enumerate(tool_calls):
            arguments = json.dumps(call.get("arguments", {}), ensure_ascii=False)
            head = {"index": index, "id": f"call_{uuid.uuid4().hex[:8]}", "type": "function", "function": {"name": call["name"], "arguments": ""}}
            self._event({"id": ident, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"tool_calls": [head]}, "finish_reason": None}]})
            for i in range(0, len(arguments), 16):  # arguments arrive in fragments, as from real servers
                piece = {"index": index, "function": {"arguments": arguments[i : i + 16]}}
                self._event({"id": ident, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"tool_calls": [piece]}, "finish_reason": None}]})
        if not rule.truncate:
            reason = "tool_calls" if tool_calls else "stop"
            self._event({"id": ident, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
            if usage is not None:
                self._event({"id": ident, "object": "chat.completion.chunk", "choices": [], "usage": usage})
            self._chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")  # the body's end (a truncated stream ends it without [DONE])
        self.wfile.flush()

    def _event(self, payload: dict[str, Any]) -> None:
        self._chunk(b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _completion(reply: str, tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply}
    if tool_calls:
        message["tool_calls"] = [
            {"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments", {}), ensure_ascii=False)}}
            for c in tool_calls
        ]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "model": "yimi-demo",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
    }


class FakeBrainServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1", port: int = 0, script: Script | None = None, *, report_usage: bool = True) -> None:
        self._open: set[socket.socket] = set()  # connections kept open between requests
        self._open_lock = threading.Lock()
        self.connections = 0  # accepted so far
        super().__init__((host, port), _Handler)  # a port in use raises here, after server_close
        self.script = script or Script()
        self.report_usage = report_usage  # False: never a usage object, like a provider that does not report it

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
            self.connections += 1
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def server_close(self) -> None:
        """Stop listening and end the connections clients keep open: a stopped brain
        answers nobody, as when its server goes away."""
        super().server_close()
        with self._open_lock:
            for request in list(self._open):
                with contextlib.suppress(OSError):
                    request.shutdown(socket.SHUT_RDWR)

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="fake-brain", daemon=True)
        thread.start()
        return thread
