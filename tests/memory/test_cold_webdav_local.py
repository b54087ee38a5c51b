"""The embedded default's cold storage (issue 19: "wsgidav in tests and on the embedded
default"; docs/memory.md "Cold packs"): ``manage.py cold_webdav``, which ``./yimi up``
starts without REDIS_URL, serves the data directory's cold-webdav/ on 127.0.0.1 with basic
auth and a password generated once (0600); a migration round uploads and verifies a pack
through it; the embedded sweeper (no Celery beat) runs the rounds."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from django.db import connections

from brain import dispatch
from brain.sweeper import stop_embedded_sweeper
from memory.archive import cold_store as archive
from memory.archive import webdav as cold_webdav
from memory.archive.models import ColdPack
from tests.conftest import db_async, need_program, open_socket
from tests.memory.test_cold_packs import Clock, Now, cold, three  # noqa: F401  (fixture)
from tests.support.ports import free_port
from tests.support.webdav_support import START_TIMEOUT, WsgiDAVServer, webdav  # noqa: F401  (fixture)

MANAGE = Path(django_settings.BASE_DIR) / "manage.py"


def serve(data_dir: Path, secrets_dir: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "yimi_project.settings", "YIMI_DATA_DIR": str(data_dir), "YIMI_SECRETS_DIR": str(secrets_dir)}
    return subprocess.Popen([sys.executable, str(MANAGE), "cold_webdav", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def wait_until_up(process: subprocess.Popen[bytes], url: str, auth: tuple[str, str]) -> None:
    deadline = time.monotonic() + START_TIMEOUT  # a deadline for a poll, never a timed assertion
    with httpx.Client(auth=auth, trust_env=False, timeout=5.0) as client:
        while True:
            try:
                if client.request("PROPFIND", url, headers={"Depth": "0"}).status_code == 207:
                    return
            except httpx.HTTPError:
                pass
            assert process.poll() is None, process.stdout.read().decode(errors="replace") if process.stdout else ""
            assert time.monotonic() < deadline, "the local cold storage did not start"
            time.sleep(0.1)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        process.wait(10)


@pytest.fixture
def local_dav(tmp_path: Path) -> Iterator[dict[str, Any]]:
    need_program("ffmpeg")  # PCM originals are sealed as FLAC
    data, secrets_dir, port = tmp_path / "data", tmp_path / "no-secrets", free_port()
    data.mkdir()
    process = serve(data, secrets_dir, port)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not (data / cold_webdav.PASSWORD_SECRET).exists():
            assert process.poll() is None and time.monotonic() < deadline, "no password was generated"
            time.sleep(0.05)
        password = (data / cold_webdav.PASSWORD_SECRET).read_text().strip()
        url = f"http://127.0.0.1:{port}/"
        wait_until_up(process, url, ("yimi", password))
        yield {"data": data, "secrets": secrets_dir, "port": port, "url": url, "password": password, "process": process}
    finally:
        stop(process)


@pytest.mark.django_db
def test_the_local_cold_storage_has_a_generated_password_and_takes_a_verified_pack(
    local_dav: dict[str, Any], settings: Any, tmp_path: Path, owner: Any
) -> None:
    data, url = local_dav["data"], local_dav["url"]
    password_file = data / cold_webdav.PASSWORD_SECRET
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600 and len(local_dav["password"]) >= 32
    assert stat.S_IMODE((data / "cold-webdav").stat().st_mode) == 0o700
    with httpx.Client(trust_env=False) as anonymous:
        assert anonymous.request("PROPFIND", url, headers={"Depth": "0"}).status_code == 401
    with httpx.Client(trust_env=False, auth=("yimi", "wrong")) as wrong:
        assert wrong.request("PROPFIND", url, headers={"Depth": "0"}).status_code == 401

    # The application finds the generated password in the data directory (no secrets mounted).
    settings.DATA_DIR, settings.SECRETS_DIR = data, local_dav["secrets"]
    settings.RAW_HOT_ROOT = tmp_path / "raw"
    settings.DISK_RESERVE_BYTES = settings.DISK_RESERVE_INODES = 0
    settings.COLD_WEBDAV_URL, settings.COLD_MAX_UPLOAD_KBPS = url, 0
    assert cold_webdav.password() == local_dav["password"]
    objs = three(owner)
    archive.register()
    try:
        report = archive.migrate_round(owner.pk, clock=Clock(), now=Now())
    finally:
        archive.unregister()
    assert report.stopped == "done" and report.objects_packed == len(objs)
    pack = ColdPack.objects.get(state=ColdPack.State.VERIFIED)
    assert (data / "cold-webdav" / pack.path).stat().st_size == pack.size

    # Started again on the same directory: the same password (generated once); a port in use fails clearly.
    second = serve(data, local_dav["secrets"], local_dav["port"])
    output, _ = second.communicate(timeout=60)
    assert second.returncode != 0 and b"set YIMI_COLD_WEBDAV_PORT" in output, output
    assert password_file.read_text().strip() == local_dav["password"]


def test_a_mounted_secret_wins_over_a_generated_one(settings: Any, tmp_path: Path) -> None:
    settings.DATA_DIR, settings.SECRETS_DIR = tmp_path / "data", tmp_path / "secrets"
    settings.DATA_DIR.mkdir()
    settings.SECRETS_DIR.mkdir()
    (settings.SECRETS_DIR / cold_webdav.PASSWORD_SECRET).write_text("from-the-deployer\n")
    assert cold_webdav.ensure_local_password() == cold_webdav.password() == "from-the-deployer"
    assert not (settings.DATA_DIR / cold_webdav.PASSWORD_SECRET).exists()


@pytest.mark.django_db(transaction=True)
async def test_the_embedded_sweeper_runs_migration_rounds(cold: WsgiDAVServer, owner: Any, make_device: Any, settings: Any) -> None:  # noqa: F811
    settings.YIMI_EMBEDDED_SWEEPER = True
    settings.ARCHIVE_ROUND_SECONDS = 0.2
    settings.DUE_SWEEP_SECONDS = 0.1
    objs = await db_async(three)(owner)
    sim = await db_async(make_device)()
    comm, _ = await open_socket(sim)  # the first connection starts the sweeper
    try:
        deadline = time.monotonic() + 30.0  # a poll's deadline, never a timed assertion
        while not await db_async(ColdPack.objects.filter(state=ColdPack.State.VERIFIED).exists)():
            assert time.monotonic() < deadline, "no round ran"
            await asyncio.sleep(0.05)
        assert sorted(await db_async(lambda: list(ColdPack.objects.get().members))()) == sorted(o.pk for o in objs)
        assert len(cold.files()) == 1
    finally:
        await comm.disconnect()
        await stop_embedded_sweeper()
        await asyncio.gather(*dispatch._tasks, return_exceptions=True)  # a round under way ends (and closes its connection)
        await sync_to_async(connections.close_all)()  # the sweeper's database thread's connection

