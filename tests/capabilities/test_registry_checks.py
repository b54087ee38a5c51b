"""The registry's static checks (issue 18, flow F4): every rule has a failing example,
a refusal names the rule and the file but never the file's content, and a candidate's
digest depends on its content only."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from capabilities.registry import add_candidate
from capabilities.registry.checks import check_pack
from capabilities.registry_models import PackCandidate
from tests.support.registry_support import candidate_manifest, write_candidate

SECRET = "sk-live9f8e7d6c5b4a39281706f5e4d3c2b1a0"


def manifest_of(path: Path) -> dict[str, Any]:
    return json.loads((path / "plugin.json").read_text())


def set_manifest(path: Path, data: dict[str, Any]) -> None:
    (path / "plugin.json").write_text(json.dumps(data))


def ext_of(data: dict[str, Any]) -> dict[str, Any]:
    return data["extensions"]["ai.yimi.capability"]


def test_a_complete_yimi_built_pack_passes(tmp_path: Path) -> None:
    report = check_pack(write_candidate(tmp_path), origin="workshop")
    assert report.findings == []
    assert report.passed and len(report.files) == 7


def test_the_digest_depends_on_the_content_only(tmp_path: Path) -> None:
    first = write_candidate(tmp_path / "a")
    second = Path(shutil.copytree(first, tmp_path / "b" / "parcelcount"))
    assert check_pack(first).digest == check_pack(second).digest
    (second / "SKILL.md").write_text("# more\n")
    assert check_pack(first).digest != check_pack(second).digest


def _edit_manifest(**ext: Any) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        data = manifest_of(path)
        ext_of(data).update(ext)
        set_manifest(path, data)

    return edit


def _add_file(rel: str, content: bytes) -> Callable[[Path], None]:
    def add(path: Path) -> None:
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(content)

    return add


def _remove(rel: str) -> Callable[[Path], None]:
    def remove(path: Path) -> None:
        target = path / rel
        shutil.rmtree(target) if target.is_dir() else target.unlink()

    return remove


def _symlink(path: Path) -> None:
    (path / "server" / "link.py").symlink_to("/etc/passwd")


def _fifo(path: Path) -> None:
    os.mkfifo(path / "server" / "pipe")


def _top_key(key: str) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        data = manifest_of(path)
        data[key] = {"pre_tool_call": "server/tools.py"}
        set_manifest(path, data)

    return edit


def _mcp(servers: dict[str, Any]) -> Callable[[Path], None]:
    return _add_file("mcp.json", json.dumps({"mcpServers": servers}).encode())


def _many_files(path: Path) -> None:
    for i in range(26):
        (path / "server" / f"part{i}.py").write_text("# part\n")


def _big_files(path: Path) -> None:
    for i in range(5):
        (path / "server" / f"data{i}.txt").write_bytes(b"x" * (120 * 1024))


CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("parent_reference", _edit_manifest(staging={"fake": "../elsewhere/tools.py"}), "plugin.json"),
    ("absolute_path", _edit_manifest(tests={"contract": "/etc/contract.yaml"}), "plugin.json"),
    ("path_not_normalized", _add_file("server/my tools.py", b"# x\n"), "server/my tools.py"),
    ("path_not_normalized", _add_file("server/.hidden", b"x\n"), "server/.hidden"),
    ("symlink", _symlink, "server/link.py"),
    ("special_file", _fifo, "server/pipe"),
    ("native_binary", _add_file("server/helper", b"\x7fELF\x02\x01\x01" + b"\0" * 64), "server/helper"),
    ("native_binary", _add_file("server/fast.so", b"not really\n"), "server/fast.so"),
    ("startup_hook", _add_file("server/evil.pth", b"import os\n"), "server/evil.pth"),
    ("startup_hook", _add_file("server/sitecustomize.py", b"import os\n"), "server/sitecustomize.py"),
    ("kernel_hook", _add_file("hooks/pre_tool_call.py", b"def hook(): pass\n"), "hooks"),
    ("kernel_hook", _top_key("hooks"), "plugin.json"),
    ("secret_file_name", _add_file("server/credentials.json", b"{}\n"), "server/credentials.json"),
    ("secret_file_name", _add_file("id_rsa", b"nothing\n"), "id_rsa"),
    ("secret_value", _add_file("server/config.py", f'API_KEY = "{SECRET}"\n'.encode()), "server/config.py"),
    ("secret_value", _add_file("server/aws.py", b"KEY_ID = 'AKIAIOSFODNN7EXAMPLE'\n"), "server/aws.py"),
    ("secret_value", _add_file("server/k.txt", b"-----BEGIN RSA PRIVATE KEY-----\nMIIB\n"), "server/k.txt"),
    ("manifest_missing", _remove("plugin.json"), "plugin.json"),
    ("manifest_invalid", _add_file("plugin.json", b"{not json"), "plugin.json"),
    ("manifest_invalid", _edit_manifest(scopes=[]), "plugin.json"),
    ("manifest_invalid", _edit_manifest(runtime={"server": "x", "lazy": True}), "plugin.json"),
    ("spend_or_self_change", _edit_manifest(tools={"count": {"effect": "spend"}}), "plugin.json"),
    (
        "spend_or_self_change",
        _edit_manifest(tools={"count": {"effect_by_arg": {"arg": "how", "map": {"look": "observe", "fix": "self_change"}}}}),
        "plugin.json",
    ),
    ("maintainer_not_yimi", _edit_manifest(maintainer="lead"), "plugin.json"),
    ("mcp_json_missing", _remove("mcp.json"), "mcp.json"),
    ("mcp_json_invalid", _mcp({"a": {"command": "python3"}, "b": {"command": "node"}}), "mcp.json"),
    ("mcp_json_invalid", _mcp({"a": {"command": "bash", "args": ["-c", "x"]}}), "mcp.json"),
    ("mcp_json_invalid", _mcp({"a": {"type": "http", "url": "http://127.0.0.1:9/mcp"}}), "mcp.json"),
    ("required_missing", _remove("skills"), "skills/parcelcount/SKILL.md"),
    ("required_missing", _remove("fake"), "fake/"),
    ("required_missing", _remove("scripts/test.py"), "scripts/test.py"),
    ("required_missing", _remove("tests/contract.yaml"), "tests/contract.yaml"),
    ("adapter_too_long", _add_file("server/tools.py", b"# line\n" * 201), ""),
    ("adapter_missing", _edit_manifest(provenance={"source": "x", "adapters": ["server/absent.py"]}), "server/absent.py"),
    ("too_many_files", _many_files, ""),
    ("file_too_large", _add_file("server/blob.txt", b"x" * (128 * 1024 + 1)), "server/blob.txt"),
    ("pack_too_large", _big_files, ""),
]


@pytest.mark.parametrize(("code", "break_it", "where"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_every_static_rule_refuses_its_failing_example(tmp_path: Path, code: str, break_it: Callable[[Path], None], where: str) -> None:
    path = write_candidate(tmp_path)
    break_it(path)
    report = check_pack(path, origin="workshop")
    assert not report.passed
    assert code in report.codes, report.findings
    assert any(f.path == where for f in report.findings if f.code == code), report.findings


def test_the_limits_are_exact(tmp_path: Path) -> None:
    """128 KiB and 200 adapter lines are allowed; one byte or one line more is not."""
    path = write_candidate(tmp_path)
    (path / "server" / "blob.txt").write_bytes(b"x" * (128 * 1024))
    lines = "from capabilities.packkit import ToolRegistry, receipt, value\nTOOLS = ToolRegistry()\n"
    lines += "# padding\n" * (200 - 2)
    (path / "server" / "tools.py").write_text(lines)
    assert not {"file_too_large", "adapter_too_long"} & set(check_pack(path).codes)
    (path / "server" / "tools.py").write_text(lines + "# one more\n")
    assert "adapter_too_long" in check_pack(path).codes


def test_an_operator_pack_maintained_by_lead_may_declare_spend(tmp_path: Path) -> None:
    """The spend/self_change rule is for Yimi's packs: the workshop's always, others when
    they say maintainer yimi."""
    path = write_candidate(tmp_path, manifest=candidate_manifest(maintainer="lead", tools={"count": {"effect": "spend"}}))
    assert "spend_or_self_change" not in check_pack(path, origin="operator").codes
    assert "spend_or_self_change" in check_pack(path, origin="workshop").codes


@pytest.mark.django_db
def test_a_refusal_never_echoes_the_secret_it_found(tmp_path: Path) -> None:
    path = write_candidate(tmp_path)
    (path / "server" / "config.py").write_text(f'token = "{SECRET}"\n')
    data = manifest_of(path)
    data["description"] = f"uses {SECRET}"
    ext_of(data)["scopes"] = [SECRET]  # a schema error on a value that is the secret
    set_manifest(path, data)
    candidate = add_candidate(path, origin="workshop", built_against=None)
    assert candidate.state == PackCandidate.State.REFUSED
    stored = PackCandidate.objects.get(pk=candidate.pk)
    text = json.dumps([stored.static_report, stored.honesty_report, stored.manifest, stored.files, str(stored)])
    assert "secret_value" in text and "manifest_invalid" in text
    assert SECRET not in text and SECRET[3:20] not in text
    assert stored.path == "" and stored.honesty_report == {}  # refused statically: not copied, not run


@pytest.mark.django_db
def test_bad_arguments_are_refused_with_a_code_and_nothing_stored(tmp_path: Path) -> None:
    from yimi_project.errors import YimiError

    path = write_candidate(tmp_path)
    with pytest.raises(YimiError) as origin:
        add_candidate(path, origin="someone", built_against=None)
    with pytest.raises(YimiError) as against:
        add_candidate(path, origin="workshop", built_against="v1")
    assert origin.value.code == against.value.code == "invalid_request"
    assert not PackCandidate.objects.exists()
