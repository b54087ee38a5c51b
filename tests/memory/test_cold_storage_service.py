"""Compose's ``cold-storage`` service (docker/cold-storage/serve.py) run as the image runs it,
without Django settings: it serves its root over WebDAV with basic auth from the secret."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
START_SECONDS = 30.0  # a deadline for a poll on a busy machine, never a timed assertion


def test_the_compose_cold_storage_service_serves_its_volume_with_basic_auth(tmp_path: Path) -> None:
    secrets_dir, cold = tmp_path / "secrets", tmp_path / "cold"
    secrets_dir.mkdir()
    (secrets_dir / "cold_webdav_password").write_text("s3cret\n")
    port = free_port()
    env = {"PATH": os.environ["PATH"], "YIMI_COLD_ROOT": str(cold), "YIMI_COLD_PORT": str(port),
           "YIMI_SECRETS_DIR": str(secrets_dir), "YIMI_COLD_WEBDAV_USER": "yimi"}
    process = subprocess.Popen([sys.executable, str(ROOT / "docker" / "cold-storage" / "serve.py")], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + START_SECONDS
        with httpx.Client(timeout=10.0, trust_env=False) as anonymous:
            while True:
                try:
                    status = anonymous.request("PROPFIND", url, headers={"Depth": "0"}).status_code
                    break
                except httpx.TransportError:
                    assert process.poll() is None, process.stdout.read().decode() if process.stdout else ""
                    assert time.monotonic() < deadline, "the cold-storage service did not start"
                    time.sleep(0.1)
            assert status == 401
        with httpx.Client(auth=("yimi", "s3cret"), timeout=10.0, trust_env=False) as client:
            assert client.put(url + "pack.bin", content=b"sealed").status_code == 201
            assert client.get(url + "pack.bin").content == b"sealed"
        assert (cold / "pack.bin").read_bytes() == b"sealed"
        assert cold.stat().st_mode & 0o777 == 0o700
    finally:
        process.terminate()
        process.wait(10)


def test_the_cold_storage_service_stops_with_a_clear_error_without_its_secret(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "YIMI_COLD_ROOT": str(tmp_path / "cold"), "YIMI_COLD_PORT": str(free_port()),
           "YIMI_SECRETS_DIR": str(tmp_path / "absent")}
    result = subprocess.run([sys.executable, str(ROOT / "docker" / "cold-storage" / "serve.py")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "cold_webdav_password" in result.stderr and "docker/README.md" in result.stderr
