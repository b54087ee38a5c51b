"""yimi_project.files: atomic, durable replacement of a file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from yimi_project import files


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_writes_content_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    files.write_atomically(target, b'{"a": 1}')
    assert target.read_bytes() == b'{"a": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_replaces_an_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "release.json"
    target.write_bytes(b"old content that is longer than the new")
    before = target.stat().st_ino
    files.write_atomically(target, b"new")
    assert target.read_bytes() == b"new"
    assert target.stat().st_ino != before  # a new file renamed over the old, not rewritten in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["release.json"]


def test_mode_is_exact_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        secret = tmp_path / "master.key"
        secret.write_bytes(b"old")
        os.chmod(secret, 0o644)
        files.write_atomically(secret, b"key", mode=0o600)
        assert _mode(secret) == 0o600
        read_only = tmp_path / "MEMORY.md"
        files.write_atomically(read_only, b"text", mode=0o444)
        assert _mode(read_only) == 0o444
        assert read_only.read_bytes() == b"text"
        files.write_atomically(read_only, b"again", mode=0o444)  # a read-only file is still replaceable
        assert read_only.read_bytes() == b"again"
        plain = tmp_path / "plain"
        files.write_atomically(plain, b"x")
        assert _mode(plain) == 0o644  # like open(): 0666 less the umask
    finally:
        os.umask(old)


def test_failure_keeps_the_old_file_and_removes_the_temporary(tmp_path: Path) -> None:
    target = tmp_path / "sub"
    target.mkdir()  # os.replace of a file over a directory fails
    with pytest.raises(OSError):
        files.write_atomically(target, b"data")
    assert target.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub"]


def test_missing_directory_is_an_error_not_a_stray_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        files.write_atomically(tmp_path / "absent" / "x", b"data")
    assert list(tmp_path.iterdir()) == []


def test_fsync_dir_refuses_a_file(tmp_path: Path) -> None:
    files.fsync_dir(tmp_path)
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        files.fsync_dir(tmp_path / "f")
