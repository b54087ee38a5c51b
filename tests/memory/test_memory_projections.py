"""L2 projections (USER.md, MEMORY.md, PERSONALITY.md) and importing core-memory files."""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from memory.assertions import preferences, projections
from memory.assertions import store as assertions
from memory.assertions.core_import import import_entries, parse_entries
from memory.assertions.store import CommitRequest
from memory.models import Assertion


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, settings: Any) -> Path:
    settings.DATA_DIR = tmp_path
    return tmp_path


def core(owner: Any, text: str, doc: str = "memory", *, expected: int = 0, aid: str | None = None) -> str:
    return assertions.commit(
        CommitRequest(
            owner_id=owner.pk, request_id=uuid.uuid4().hex, predicate="core_profile.entry", payload={"text": text, "doc": doc},
            expected_version=expected, assertion_id=uuid.UUID(aid) if aid else None,
        )
    ).assertion_id


def read(name: str) -> str:
    return (projections.memories_dir() / name).read_text(encoding="utf-8")


def test_user_and_memory_md_are_generated_from_core_profile_entries_read_only(owner: Any, django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        core(owner, "名字叫王小明，住在杭州", doc="user")
        core(owner, "不吃香菜", doc="user")
        core(owner, "每周五晚上和家人视频", doc="memory")
        assertions.commit(CommitRequest(owner_id=owner.pk, request_id="other", predicate="preference.drink", payload={"text": "冰美式"}, expected_version=0))
    assert projections.body(read("USER.md")) == "名字叫王小明，住在杭州\n§\n不吃香菜"
    assert projections.body(read("MEMORY.md")) == "每周五晚上和家人视频"
    assert "冰美式" not in read("USER.md") + read("MEMORY.md")  # only core_profile.entry assertions
    for name in ("USER.md", "MEMORY.md", "PERSONALITY.md"):
        mode = stat.S_IMODE(os.stat(projections.memories_dir() / name).st_mode)
        assert mode == 0o444, (name, oct(mode))
        assert read(name).startswith("<!-- " + name)


def test_projections_are_regenerated_when_their_sources_change(owner: Any, django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        aid = core(owner, "不吃香菜", doc="user")
        core(owner, "住在杭州", doc="user")
    assert "不吃香菜" in read("USER.md")
    with django_capture_on_commit_callbacks(execute=True):
        core(owner, "香菜现在能吃了", doc="user", expected=1, aid=aid)
    assert "香菜现在能吃了" in read("USER.md") and "不吃香菜" not in read("USER.md")
    with django_capture_on_commit_callbacks(execute=True):
        assertions.forget(owner.pk, aid, request_id="forget-coriander")
    assert projections.body(read("USER.md")) == "住在杭州"
    assert projections.stale(owner.pk) == []


def test_a_missing_or_stale_projection_is_regenerated_before_a_run_reads_it(owner: Any) -> None:
    core(owner, "住在杭州", doc="user")  # no on-commit callbacks ran: the files do not exist yet
    assert set(projections.stale(owner.pk)) == {"USER.md", "MEMORY.md", "PERSONALITY.md"}
    profile = projections.core_profile(owner.pk)
    assert projections.body(profile.user) == "住在杭州" and projections.stale(owner.pk) == []
    path = projections.memories_dir() / "USER.md"
    path.chmod(0o644)
    path.write_text("edited by hand", encoding="utf-8")
    assert projections.stale(owner.pk) == ["USER.md"]
    assert projections.body(projections.core_profile(owner.pk).user) == "住在杭州"
    assert stat.S_IMODE(path.stat().st_mode) == 0o444


def test_personality_md_projects_the_speaking_preferences(owner: Any, django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        preferences.set_preferences(owner.pk, "说话简短，多用口语，偶尔用一个 emoji", expected_version=0, request_id="p1")
    assert projections.body(read("PERSONALITY.md")) == "说话简短，多用口语，偶尔用一个 emoji"
    with django_capture_on_commit_callbacks(execute=True):
        preferences.set_preferences(owner.pk, "更正式一点", expected_version=1, request_id="p2")
    assert projections.body(read("PERSONALITY.md")) == "更正式一点"


def test_regenerate_rewrites_only_changed_files(owner: Any) -> None:
    core(owner, "住在杭州", doc="user")
    assert sorted(projections.regenerate(owner.pk)) == ["MEMORY.md", "PERSONALITY.md", "USER.md"]
    assert projections.regenerate(owner.pk) == []
    core(owner, "养了一只猫", doc="memory")
    assert projections.regenerate(owner.pk) == ["MEMORY.md"]
    call_command("memory_projections", "--check")
    with pytest.raises(CommandError):
        core(owner, "新的", doc="user")
        call_command("memory_projections", "--check")


# --- import ---------------------------------------------------------------------------------------


def test_entries_are_one_per_line_or_per_section() -> None:
    assert parse_entries("- 不吃香菜\n* 住在杭州\n\n1. 有一只猫\n") == ["不吃香菜", "住在杭州", "有一只猫"]
    assert parse_entries("<!-- header -->\n第一条\n第二行\n§\n第二条\n§\n") == ["第一条\n第二行", "第二条"]
    assert parse_entries("intro\n# 家人\n妈妈在杭州\n## 工作\n做设计\n") == ["intro", "# 家人\n妈妈在杭州", "## 工作\n做设计"]


def test_importing_core_memory_files_makes_core_profile_entries(owner: Any, tmp_path: Path, capsys: Any) -> None:
    memory_md = tmp_path / "MEMORY.md"
    user_md = tmp_path / "USER.md"
    memory_md.write_text("每周五晚上和家人视频\n§\n项目代号 依米\n", encoding="utf-8")
    user_md.write_text("- 名字叫王小明\n- 不吃香菜\n", encoding="utf-8")
    call_command("memory_import", "--memory", str(memory_md), "--user", str(user_md))
    out = capsys.readouterr().out
    assert "MEMORY.md: 2 new, 0 already imported" in out and "USER.md: 2 new, 0 already imported" in out
    rows = assertions.query(owner.pk, predicate="core_profile.entry")
    assert sorted((r["payload"]["doc"], r["payload"]["text"]) for r in rows) == [
        ("memory", "每周五晚上和家人视频"), ("memory", "项目代号 依米"), ("user", "不吃香菜"), ("user", "名字叫王小明"),
    ]
    assert {v for v in Assertion.objects.values_list("versions__actor", flat=True)} == {"import"}


def test_importing_again_brings_in_only_entries_added_since(owner: Any, tmp_path: Path, capsys: Any) -> None:
    user_md = tmp_path / "USER.md"
    user_md.write_text("名字叫王小明\n不吃香菜\n", encoding="utf-8")
    call_command("memory_import", "--user", str(user_md))
    coriander = next(r for r in assertions.query(owner.pk) if r["payload"]["text"] == "不吃香菜")
    assertions.forget(owner.pk, coriander["id"], request_id="forget-it")  # forgotten after the first import
    user_md.write_text("名字叫王小明\n不吃香菜\n养了一只猫叫年糕\n", encoding="utf-8")
    capsys.readouterr()
    call_command("memory_import", "--user", str(user_md))
    assert "USER.md: 1 new, 2 already imported" in capsys.readouterr().out
    texts = sorted(r["payload"]["text"] for r in assertions.query(owner.pk))
    assert texts == ["养了一只猫叫年糕", "名字叫王小明"]  # the forgotten one did not come back
    assert Assertion.objects.count() == 3


def test_an_entry_that_is_too_long_is_refused_and_reported(owner: Any) -> None:
    report = import_entries(owner.pk, "ok\n" + "x" * 2001 + "\n", doc="user")
    assert len(report.imported) == 1 and len(report.refused) == 1 and report.refused[0].startswith("invalid_request")
