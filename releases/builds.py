"""Building a directory release, and cleanup.

A directory release is the code at one commit (``git archive``, so nothing uncommitted and
nothing ignored gets in) plus its virtual environment, in a new directory under the
releases root: ``<commit[:12]>-<digest[:12]>/{code,venv,MANIFEST,release.json}``. Its build
id is ``dir:<sha256 of MANIFEST>``; MANIFEST names the commit and lists every file of
``code/`` (path, mode, SHA-256; a symlink by its target), sorted, so the same commit always
gives the same id and another commit or any changed byte gives another. The virtual environment is made from the code's own
``requirements.lock`` and, for the gate's suites, ``requirements-dev.lock`` (both hash-checked) by default; ``make_venv`` is injectable (tests make a
venv without pip that sees the running interpreter's packages — real, but cheap). It is
derived from the code, so it is not in the manifest.

Steps of ``build_directory_release``: 1. resolve the commit; 2. archive it into a staging
directory ``.build-<random>`` under the root; 3. write MANIFEST, compute the id; 4. the
id's directory already there: the same immutable build, staging removed, its row
returned; 5. make the venv, write ``release.json``, make ``code/`` read-only; 6. rename the
staging directory into place (atomic) and record the ``Release`` (``built``); 7. the
protected-baseline check (``releases.baseline.check_release``): a candidate that touches
the baseline opens its card now, so the owner can answer while the gate runs.

Docker hosts build an image instead (id = its digest): not built here yet.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Callable
from pathlib import Path

from releases import baseline, services
from releases.models import Release
from releases.pointers import ReleaseDir, pointer_lock, read_pointers, releases_root
from yimi_project.errors import YimiError

MakeVenv = Callable[[Path, Path], None]
Progress = Callable[[str], None]


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise YimiError("git_failed", f"git {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def resolve_commit(repo: Path, ref: str) -> str:
    return git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").strip()


def lock_venv(venv: Path, code: Path) -> None:
    """The production venv: ``python -m venv``, then the code's own lock file, hash-checked,
    then its test lock ``requirements-dev.lock`` when the commit has one, so the gate can run
    the release's suites with the release's own interpreter (without it, pytest is missing
    and every suite exits unparsable). The test lock is compiled against
    ``requirements.lock`` (``./yimi lock``): it only adds packages, it moves none the
    services run."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    lock = code / "requirements.lock"
    if not lock.is_file():
        raise YimiError("release_invalid", "the commit has no requirements.lock to build its environment from")
    for name in ("requirements.lock", "requirements-dev.lock"):
        if (code / name).is_file():
            subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--require-hashes", "-r", str(code / name)], check=True)


def shared_venv(venv: Path, code: Path) -> None:
    """A venv without pip that sees the running interpreter's packages (a ``.pth`` file):
    a real interpreter of its own, made in a second. For tests and for hosts whose
    dependencies did not change."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    paths = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "yimi-shared.pth").write_text("\n".join(paths) + "\n")


VENV_BUILDERS: dict[str, MakeVenv] = {"lock": lock_venv, "shared": shared_venv}


def manifest(code: Path, commit: str) -> bytes:
    """``commit <sha>``, then one line per file of ``code``: ``mode path sha256`` (symlinks:
    ``link path -> target``), sorted."""
    lines = [f"commit {commit}"]
    for path in sorted(code.rglob("*")):
        rel = path.relative_to(code).as_posix()
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            lines.append(f"link {rel} -> {os.readlink(path)}")
        elif stat.S_ISREG(info.st_mode):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            lines.append(f"{'755' if info.st_mode & 0o111 else '644'} {rel} {digest}")
    return ("\n".join(lines) + "\n").encode()


def _make_read_only(code: Path) -> None:
    for path in code.rglob("*"):
        if not path.is_symlink():
            path.chmod(path.stat().st_mode & ~0o222)
    code.chmod(code.stat().st_mode & ~0o222)


def _writable(tree: Path) -> None:
    for path in [tree, *tree.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | stat.S_IWUSR)


def remove_tree(tree: Path) -> None:
    if tree.exists():
        _writable(tree)
        shutil.rmtree(tree)


def build_directory_release(
    repo: Path,
    ref: str,
    *,
    root: Path | None = None,
    base_commit: str | None = None,
    make_venv: MakeVenv = lock_venv,
    progress: Progress = lambda _line: None,
) -> Release:
    """Build ``ref`` of ``repo`` into a release directory (steps in the module docstring).
    ``base_commit`` is the live commit the candidate was made on (default: the commit
    ``current`` runs now, or none on a first install)."""
    root = (root or releases_root()).resolve()
    root.mkdir(parents=True, exist_ok=True)
    commit = resolve_commit(repo, ref)
    if not commit:
        raise YimiError("release_invalid", f"{ref!r} is not a commit of {repo}")
    if base_commit is None:
        live = read_pointers(root).current
        base_commit = live.commit if live else ""
    message = git(repo, "log", "-1", "--format=%B", commit)
    progress(f"archiving {commit[:12]}")
    staging = root / f".build-{uuid.uuid4().hex[:12]}"
    code = staging / "code"
    code.mkdir(parents=True)
    try:
        archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit], capture_output=True, check=True)
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(code, filter="data")
        body = manifest(code, commit)
        digest = hashlib.sha256(body).hexdigest()
        build_id = f"dir:{digest}"
        (staging / "MANIFEST").write_bytes(body)
        final = root / f"{commit[:12]}-{digest[:12]}"
        if final.exists():
            progress(f"{build_id} is already built at {final.name}")
            remove_tree(staging)
            return _checked(services.record_release(
                build_id=build_id, kind="directory", commit=commit, base_commit=base_commit, path=str(final), message=message
            ), root, repo, progress)
        progress(f"making the virtual environment ({getattr(make_venv, '__name__', 'custom')})")
        make_venv(staging / "venv", code)
        ReleaseDir(path=staging, build_id=build_id, commit=commit, base_commit=base_commit, message=message).write()
        _make_read_only(code)
        os.rename(staging, final)
    except BaseException:
        remove_tree(staging)
        raise
    progress(f"release directory {final.name} ready")
    return _checked(services.record_release(
        build_id=build_id, kind="directory", commit=commit, base_commit=base_commit, path=str(final), message=message
    ), root, repo, progress)


def _checked(release: Release, root: Path, repo: Path, progress: Progress) -> Release:
    """Step 7: the protected-baseline check of the new build (a card, when it touches it)."""
    baseline.check_release(release, "build", root=root, repo=repo)
    progress(baseline.describe(release))
    return release


def cleanup(root: Path | None = None, *, progress: Progress = lambda _line: None) -> list[str]:
    """Remove every release directory but ``current`` and ``previous`` (and any staging
    directory left by an interrupted build), under the pointer lock; their rows become
    ``removed``. Returns the names removed."""
    root = (root or releases_root()).resolve()
    removed: list[str] = []
    with pointer_lock(root):
        pointers = read_pointers(root)
        keep = {p.path.name for p in (pointers.current, pointers.previous) if p is not None}
        for entry in sorted(root.iterdir()):
            if entry.is_symlink() or not entry.is_dir() or entry.name in keep:
                continue
            if not entry.name.startswith(".build-") and not (entry / "release.json").is_file():
                continue  # not ours
            build = None
            if (entry / "release.json").is_file():
                build = ReleaseDir.read(entry).build_id
            progress(f"removing {entry.name}")
            remove_tree(entry)
            removed.append(entry.name)
            if build:
                services.mark_removed(build)
        services.record_event("cleanup", details={"removed": removed, "kept": sorted(keep)})
    return removed
