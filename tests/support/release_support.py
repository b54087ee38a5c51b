"""Small real releases for the release tests: a temporary git repository whose commits are
a tiny HTTP service (it reports the build id of the release directory it runs from on
/healthz, healthy or not as the commit says) and, where a test wants, a tiny pytest
suite; releases built from it with the cheap shared venv; and ``ProcessService`` on a
free port."""

from __future__ import annotations

import subprocess
from functools import partial
from pathlib import Path

from releases.pointers import verify_services
from releases.processes import ProcessService

SERVE = '''\
import http.server, json, pathlib, sys

port = int(sys.argv[1])
here = pathlib.Path.cwd()
build = json.loads((here.parent / "release.json").read_text())["build_id"]
healthy = (here / "HEALTHY").read_text().strip() == "yes"


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"status": "ok" if healthy else "failing", "build": build}).encode()
        self.send_response(200 if healthy else 503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


class Repo:
    """A git repository in a temporary directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True)
        self.git("init", "-q", "-b", "main")
        self.write("serve.py", SERVE)

    def git(self, *args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(self.path), "-c", "user.email=t@example.org", "-c", "user.name=t", *args],
            check=True, capture_output=True, text=True,
        ).stdout.strip()

    def write(self, name: str, text: str) -> None:
        target = self.path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def commit(self, message: str, *, healthy: bool = True, files: dict[str, str] | None = None) -> str:
        self.write("HEALTHY", "yes\n" if healthy else "no\n")
        for name, text in (files or {}).items():
            self.write(name, text)
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD")



def web_service(port: int, *, run_dir: Path | None = None) -> ProcessService:
    return ProcessService(
        "web", ["{release}/venv/bin/python", "serve.py", str(port)], health_url=f"http://127.0.0.1:{port}/healthz", run_dir=run_dir
    )


# A service that is not healthy stays unhealthy: three looks are enough, and no test waits on time.
quick_verify = partial(verify_services, attempts=3, interval=0.05)
