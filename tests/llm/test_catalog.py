"""The local model catalog: digests, metadata validation, the signed switch, and when each
kind's switch becomes effective (restart, re-enrollment, index rebuild). Real models:
the Silero VAD from the silero-vad wheel and speaker-embedding ONNX models built here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from accounts import voiceprint
from accounts.voiceprint import EnrollmentSegment
from llm import catalog, model_settings
from llm.models import ModelSelection, ModelSwitch
from memory.timeline import entries as timeline
from tests.support import voice_support
from tests.support.voice_support import SPEAKER_METADATA, build_speaker_model, entry, write_catalog
from voice import engines
from voice import services as voice_services
from yimi_project.errors import YimiError

# fixtures
embeddings_server = voice_support.embeddings_server
voice_assets = voice_support.voice_assets
voice_catalog = voice_support.voice_catalog

pytestmark = pytest.mark.django_db


def signed(sim: Any, kind: str, model_id: str, version: str, *, issued_at: int | None = None, nonce: str | None = None) -> model_settings.SignedSwitch:
    cat_entry = catalog.load_catalog().find(kind, model_id, version)
    digest = cat_entry.digest_summary if cat_entry else "0" * 64
    issued = int(time.time()) if issued_at is None else issued_at
    nonce = nonce or uuid.uuid4().hex
    message = model_settings.model_switch_message(str(sim.device.id), kind, model_id, version, digest, issued, nonce)
    return model_settings.SignedSwitch(str(sim.device.id), kind, model_id, version, issued, nonce, sim.sign(message))


def add_entries(voice_catalog: dict[str, Any], *extra: dict[str, Any]) -> None:
    voice_catalog["entries"].extend(extra)
    write_catalog(voice_catalog["path"], voice_catalog["entries"])
    # a catalog file rewritten within the same mtime tick must still be re-read
    catalog._cache.clear()


# --- reading and checking ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, fragment",
    [
        ("{not json", "not valid JSON"),
        ('{"kind": "vad"}', "JSON list"),
        ('[{"kind": "tts", "id": "a", "version": "1", "files": {"model": {"path": "/m", "sha256": "%s"}}}]' % ("0" * 64), "kind must be one of"),
        ('[{"kind": "vad", "id": "a", "version": "1", "files": {"model": {"path": "rel/m.onnx", "sha256": "%s"}}}]' % ("0" * 64), "absolute"),
        ('[{"kind": "vad", "id": "a", "version": "1", "files": {"model": {"path": "/m", "sha256": "xyz"}}}]', "64 hex"),
        ('[{"kind": "asr", "id": "a", "version": "1", "files": {"model": {"path": "/m", "sha256": "%s"}}, "metadata": {"type": "transducer"}}]' % ("0" * 64), "needs the files encoder"),
        ('[{"kind": "embedding", "id": "a", "version": "1", "files": {"model": {"path": "/m", "sha256": "%s"}}, "metadata": {"dim": 8}}]' % ("0" * 64), "endpoint"),
    ],
)
def test_a_broken_catalog_is_reported_and_changes_nothing(raw: str, fragment: str, tmp_path: Path, settings: Any) -> None:
    path = tmp_path / "catalog.json"
    path.write_text(raw)
    settings.YIMI_LOCAL_CATALOG_FILE = str(path)
    with pytest.raises(YimiError) as err:
        catalog.parse_catalog(raw)
    assert err.value.code == "catalog_invalid" and fragment in err.value.message
    loaded = catalog.load_catalog()
    assert loaded.entries == () and fragment in loaded.error
    assert model_settings.selection("vad").state == "none"


def test_catalog_digest_mismatch_is_refused_and_changes_nothing(voice_catalog: dict[str, Any], make_device: Any, tmp_path: Path) -> None:
    sim = make_device()
    copy = tmp_path / "speaker-v2.onnx"
    shutil.copy(voice_catalog["speaker_model"], copy)
    add_entries(voice_catalog, entry("voiceprint", "test-speaker", "2", {"model": str(copy)}))
    before = model_settings.selection("voiceprint").effective_key
    with copy.open("ab") as fh:  # the file changed after the deployer recorded its digest
        fh.write(b"\0")
    with pytest.raises(YimiError) as err:
        model_settings.switch_model(signed(sim, "voiceprint", "test-speaker", "2"))
    assert err.value.code == "model_digest_mismatch"
    row = ModelSelection.objects.get(kind="voiceprint")
    assert (row.selected_key, row.effective_key, row.state) == (before, before, "effective")
    assert ModelSwitch.objects.count() == 0
    with pytest.raises(YimiError) as err:
        engines.speaker_embedder(catalog.load_catalog().find("voiceprint", "test-speaker", "2"))
    assert err.value.code == "model_digest_mismatch"


def test_a_file_swapped_after_verification_is_caught_before_its_next_use(voice_catalog: dict[str, Any], tmp_path: Path) -> None:
    copy = tmp_path / "vad.onnx"
    shutil.copy(voice_catalog["vad_model"], copy)
    vad_entry = catalog.parse_catalog(json.dumps([entry("vad", "v", "1", {"model": str(copy)})]))[0]
    catalog.verify_files(vad_entry)
    verified_mtime = copy.stat().st_mtime_ns
    copy.write_bytes(copy.read_bytes()[:-1] + b"\1")  # same inode, same size
    os.utime(copy, ns=(verified_mtime, verified_mtime + 10**9))  # a later write, however coarse the file system's clock
    with pytest.raises(YimiError) as err:
        catalog.verify_files(vad_entry)
    assert err.value.code == "model_digest_mismatch"


BAD_METADATA = {
    "missing framework": ({k: v for k, v in SPEAKER_METADATA.items() if k != "framework"} | {"output_dim": "80"}, "missing metadata framework"),
    "missing output_dim": (dict(SPEAKER_METADATA), "missing metadata output_dim"),
    "missing language": ({k: v for k, v in SPEAKER_METADATA.items() if k != "language"} | {"output_dim": "80"}, "missing metadata language"),
    "unknown framework": (SPEAKER_METADATA | {"framework": "foo", "output_dim": "80"}, "framework must be"),
    "nemo without its keys": (SPEAKER_METADATA | {"framework": "nemo", "output_dim": "80"}, "framework must be"),
    "8 kHz": (SPEAKER_METADATA | {"sample_rate": "8000", "output_dim": "80"}, "sample_rate must be 16000"),
    "wrong output_dim": (SPEAKER_METADATA | {"output_dim": "192"}, "the output must be [N, 192]"),
    "no metadata": ({}, "missing metadata"),
}


@pytest.mark.parametrize("case", sorted(BAD_METADATA))
def test_bad_model_metadata_is_refused_without_crashing(case: str, tmp_path: Path) -> None:
    metadata, fragment = BAD_METADATA[case]
    path = build_speaker_model(tmp_path / "bad.onnx", metadata=metadata)
    bad = catalog.parse_catalog(json.dumps([entry("voiceprint", "bad", "1", {"model": path})]))[0]
    with pytest.raises(YimiError) as err:
        engines.speaker_embedder(bad)  # in this process: it must raise, not kill us
    assert err.value.code == "model_metadata_invalid" and fragment in err.value.message


def test_an_unreadable_model_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "garbage.onnx"
    path.write_bytes(b"not an onnx model" * 10)
    bad = catalog.parse_catalog(json.dumps([entry("voiceprint", "bad", "1", {"model": str(path)})]))[0]
    with pytest.raises(YimiError) as err:
        engines.speaker_embedder(bad)
    assert err.value.code == "model_unreadable"


def test_a_bad_model_kills_the_process_that_loads_it_but_the_probe_contains_it(tmp_path: Path) -> None:
    """Why the checks exist: the same model handed straight to sherpa-onnx kills the process
    that loads it. The trial load in a child process turns that into an error."""
    path = build_speaker_model(tmp_path / "no-language.onnx", metadata={k: v for k, v in SPEAKER_METADATA.items() if k != "language"} | {"output_dim": "80"})
    direct = (
        "import sherpa_onnx; "
        f"sherpa_onnx.SpeakerEmbeddingExtractor(sherpa_onnx.SpeakerEmbeddingExtractorConfig(model={path!r}, num_threads=1)); "
        "print('survived')"
    )
    crashed = subprocess.run([sys.executable, "-c", direct], capture_output=True, text=True, timeout=60, check=False)
    assert crashed.returncode != 0 and "survived" not in crashed.stdout
    bad = catalog.parse_catalog(json.dumps([entry("voiceprint", "bad", "1", {"model": path})]))[0]
    with pytest.raises(YimiError) as err:
        engines.probe(bad)  # bypassing the metadata check: the child dies, we do not
    assert err.value.code == "model_load_failed" and err.value.details["exit_status"] != 0


def test_a_model_that_is_not_silero_is_refused_as_vad(voice_catalog: dict[str, Any]) -> None:
    bad = catalog.parse_catalog(json.dumps([entry("vad", "not-vad", "1", {"model": voice_catalog["speaker_model"]})]))[0]
    with pytest.raises(YimiError) as err:
        engines.voice_activity_detector(bad)
    assert err.value.code == "model_metadata_invalid"


# --- ASR and wake word: loaders exist, nothing is faked -----------------------------------------------


def test_no_asr_model_means_transcription_unavailable(voice_catalog: dict[str, Any], make_device: Any) -> None:
    sim = make_device()
    session, status = voice_services.open_session(sim.device, "phone_app")
    assert (status.transcription, status.wake_word, status.voiceprint) == ("unavailable", "device", "available")
    assert session.transcriber is None and session.wake_stream is None
    assert model_settings.selection("asr").state == "none"


def test_asr_and_wake_word_models_are_checked_before_loading(voice_catalog: dict[str, Any], make_device: Any, tmp_path: Path) -> None:
    sim = make_device()
    files = {}
    for role in ("encoder", "decoder", "joiner"):
        files[role] = tmp_path / f"{role}.onnx"
        files[role].write_bytes(b"definitely not onnx")
    files["tokens"] = tmp_path / "tokens.txt"
    files["tokens"].write_text("<blk> 0\n")
    files["keywords"] = tmp_path / "keywords.txt"
    files["keywords"].write_text("y í m ǐ @依米\n")
    asr = entry("asr", "zipformer", "1", {k: str(files[k]) for k in ("encoder", "decoder", "joiner", "tokens")}, {"type": "transducer"})
    kws = entry("wake_word", "kws", "1", {k: str(v) for k, v in files.items()})
    asr["files"]["tokens"]["sha256"] = "0" * 64  # and a wrong digest on one file
    add_entries(voice_catalog, asr, kws)
    _session, status = voice_services.open_session(sim.device, "phone_app")
    assert status.transcription == "unavailable" and status.problems["asr"] == "model_digest_mismatch"
    assert status.wake_word == "device" and status.problems["wake_word"] == "model_unreadable"
    assert model_settings.selection("asr").error_code == "model_digest_mismatch"
    assert model_settings.selection("wake_word").error_code == "model_unreadable"


# --- the signed switch ----------------------------------------------------------------------------------


def test_model_switch_must_be_signed_on_an_owner_device(voice_catalog: dict[str, Any], make_device: Any, tmp_path: Path) -> None:
    sim, other, guest = make_device(), make_device(), make_device(guest=True)
    copy = tmp_path / "vad-2.onnx"
    shutil.copy(voice_catalog["vad_model"], copy)
    add_entries(voice_catalog, entry("vad", "silero-vad", "6.1", {"model": str(copy)}))
    model_settings.process_model("vad")
    good = signed(sim, "vad", "silero-vad", "6.1")
    attempts = {
        "bad_signature": good.__class__(**{**good.__dict__, "signature": signed(other, "vad", "silero-vad", "6.1").signature}),
        "forbidden": signed(guest, "vad", "silero-vad", "6.1"),
        "switch_expired": signed(sim, "vad", "silero-vad", "6.1", issued_at=int(time.time()) - 600),
        "unknown_model": signed(sim, "vad", "silero-vad", "9"),
        "face_switch_via_enrollment": signed(sim, "face", "yunet", "1"),
    }
    # a signature made for another version does not switch to this one
    other_version = signed(sim, "vad", "silero-vad", "6")
    attempts["bad_signature_other_version"] = good.__class__(**{**good.__dict__, "signature": other_version.signature})
    for expected, attempt in attempts.items():
        with pytest.raises(YimiError) as err:
            model_settings.switch_model(attempt)
        assert err.value.code == expected.removesuffix("_other_version"), expected
    row = ModelSelection.objects.get(kind="vad")
    assert (row.selected_key, row.state) == ("silero-vad@6", "effective") and ModelSwitch.objects.count() == 0
    model_settings.switch_model(good)
    switch = ModelSwitch.objects.get()
    assert switch.device_id == sim.device.id and switch.message.startswith("yimi-model-switch-v1\n")
    with pytest.raises(YimiError) as err:
        model_settings.switch_model(good)
    assert err.value.code == "switch_replayed"


def test_vad_switch_becomes_effective_after_a_restart(voice_catalog: dict[str, Any], make_device: Any, tmp_path: Path) -> None:
    sim = make_device()
    copy = tmp_path / "vad-2.onnx"
    shutil.copy(voice_catalog["vad_model"], copy)
    add_entries(voice_catalog, entry("vad", "silero-vad", "6.1", {"model": str(copy)}))
    voice_services.open_session(sim.device, "phone_app")
    assert model_settings.process_model("vad").key == "silero-vad@6"
    row = model_settings.switch_model(signed(sim, "vad", "silero-vad", "6.1"))
    assert (row.selected_key, row.effective_key, row.state) == ("silero-vad@6.1", "silero-vad@6", "pending_restart")
    voice_services.open_session(sim.device, "phone_app")  # a new session in this process
    assert model_settings.process_model("vad").key == "silero-vad@6"  # keeps the model it runs
    row.refresh_from_db()
    assert (row.effective_key, row.state) == ("silero-vad@6", "pending_restart")
    overview = {r["kind"]: r for r in model_settings.settings_overview()}
    assert "restarted" in overview["vad"]["note"]
    model_settings.forget_process_models()  # what a restarted process starts with
    voice_services.open_session(sim.device, "phone_app")
    assert model_settings.process_model("vad").key == "silero-vad@6.1"
    row.refresh_from_db()
    assert (row.selected_key, row.effective_key, row.previous_key, row.state) == (
        "silero-vad@6.1", "silero-vad@6.1", "silero-vad@6", "effective",
    )


def test_voiceprint_switch_needs_every_channel_in_use_enrolled_again(voice_catalog: dict[str, Any], make_device: Any, tmp_path: Path) -> None:
    sim = make_device()
    owner_id = sim.device.owner_id
    v2 = build_speaker_model(tmp_path / "speaker-v2.onnx", bias=np.full(80, 0.01))
    add_entries(voice_catalog, entry("voiceprint", "test-speaker", "2", {"model": v2}, {"output_dim": 80}))
    segs = [EnrollmentSegment((np.eye(80)[0] + 0.01 * i).tolist(), 2000) for i in range(5)]
    for channel in ("phone_app", "glasses"):
        voiceprint.enroll_channel(owner_id, channel, "test-speaker@1", segs)
    row = model_settings.switch_model(signed(sim, "voiceprint", "test-speaker", "2"))
    assert (row.state, row.effective_key, row.progress_done, row.progress_total) == ("needs_enrollment", "test-speaker@1", 0, 2)
    assert model_settings.effective_entry("voiceprint").key == "test-speaker@1"  # identity keeps the old model
    voiceprint.enroll_channel(owner_id, "phone_app", "test-speaker@2", segs)
    row = model_settings.settle_voiceprint_switch(owner_id)
    assert (row.state, row.progress_done) == ("needs_enrollment", 1)
    voiceprint.enroll_channel(owner_id, "glasses", "test-speaker@2", segs)
    row = model_settings.settle_voiceprint_switch(owner_id)
    assert (row.state, row.effective_key, row.previous_key, row.progress_done) == ("effective", "test-speaker@2", "test-speaker@1", 2)
    # the new model's channels start at the floor: recalibrated, not inherited
    assert voiceprint.threshold(owner_id, "phone_app", "test-speaker@2") == 0.65


def test_embedding_switch_becomes_effective_only_after_the_index_rebuild(
    voice_catalog: dict[str, Any], make_device: Any, embeddings_server: Any, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    from llm.vector_index import read_index

    sim = make_device()
    for i in range(40):
        timeline.append_entry(owner_id=sim.device.owner_id, kind="utterance", text=f"note number {i} about the garden", device_id=sim.device.id, scope="owner")
    timeline.append_entry(owner_id=sim.device.owner_id, kind="notice", text="a notice is not indexed", scope="owner")
    model = tmp_path / "embedder.bin"
    model.write_bytes(b"weights the runtime serves")
    meta = {"dim": 16, "endpoint": embeddings_server.endpoint}
    add_entries(
        voice_catalog,
        entry("embedding", "text-embed", "1", {"model": str(model)}, meta, default=True),
        entry("embedding", "text-embed", "2", {"model": str(model)}, meta),
    )
    with django_capture_on_commit_callbacks(execute=True):
        first = model_settings.selection("embedding")
    assert first.state == "rebuilding"
    first.refresh_from_db()
    assert (first.effective_key, first.state, first.progress_done, first.progress_total) == ("text-embed@1", "effective", 40, 40)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        row = model_settings.switch_model(signed(sim, "embedding", "text-embed", "2"))
    assert (row.state, row.effective_key) == ("rebuilding", "text-embed@1")  # not before the index exists
    for callback in callbacks:
        callback()
    row.refresh_from_db()
    assert (row.state, row.effective_key, row.previous_key, row.progress_done, row.progress_total) == (
        "effective", "text-embed@2", "text-embed@1", 40, 40,
    )
    seqs, vectors, meta_read = read_index(catalog.load_catalog().find("embedding", "text-embed", "2"))
    assert len(seqs) == 40 and vectors.shape == (40, 16) and meta_read["model"] == "text-embed@2"
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    # recall searches the same rows, with the catalog's effective model as its embedder
    from memory.timeline.embeddings import configured_embedder, nearest

    embedder = configured_embedder()
    assert embedder is not None and embedder.name == "text-embed@2" and embedder.dim == 16
    assert len(nearest(sim.device.owner_id, embedder, "note number 3 about the garden", limit=5)) == 5
    # a failed rebuild shows its error and leaves the effective model alone
    embeddings_server.fail = True
    with django_capture_on_commit_callbacks(execute=True):
        model_settings.switch_model(signed(sim, "embedding", "text-embed", "1"))
    row.refresh_from_db()
    assert (row.state, row.selected_key, row.effective_key, row.error_code) == ("failed", "text-embed@1", "text-embed@2", "embedding_runtime_error")


def test_face_models_are_listed_only(voice_catalog: dict[str, Any], make_device: Any, tmp_path: Path) -> None:
    sim = make_device()
    face = tmp_path / "face.onnx"
    face.write_bytes(b"face model")
    add_entries(voice_catalog, entry("face", "sface", "1", {"model": str(face)}, default=True))
    row = model_settings.selection("face")
    assert (row.state, row.selected_key, row.effective_key) == ("listed", "", "")
    overview = {r["kind"]: r for r in model_settings.settings_overview()}
    assert [e["key"] for e in overview["face"]["entries"]] == ["sface@1"]
    with pytest.raises(YimiError) as err:
        model_settings.switch_model(signed(sim, "face", "sface", "1"))
    assert err.value.code == "face_switch_via_enrollment"


def test_settings_page_shows_selected_effective_previous_progress_and_errors(
    voice_catalog: dict[str, Any], make_device: Any, client: Any, tmp_path: Path
) -> None:
    sim = make_device()
    copy = tmp_path / "vad-2.onnx"
    shutil.copy(voice_catalog["vad_model"], copy)
    add_entries(voice_catalog, entry("vad", "silero-vad", "6.1", {"model": str(copy)}))
    model_settings.process_model("vad")
    model_settings.selection("voiceprint")
    ModelSelection.objects.filter(kind="voiceprint").update(error_code="model_load_failed", error_message="trial load failed")
    client.force_login(sim.device.owner)
    page = client.get("/admin/llm/modelselection/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "silero-vad@6" in html and "model_load_failed: trial load failed" in html and "takes effect" not in html
    prepared = client.get("/admin/llm/modelselection/", {"prepare": "vad:silero-vad@6.1", "device": str(sim.device.id)})
    form = prepared.context["prepared"]
    message = form["message"].encode()
    assert message.startswith(b"yimi-model-switch-v1\n" + str(sim.device.id).encode())
    body = {"device_id": str(sim.device.id), "kind": "vad", "model_id": "silero-vad", "version": "6.1",
            "issued_at": str(form["issued_at"]), "nonce": form["nonce"], "signature": sim.sign(message)}
    refused = client.post("/admin/llm/modelselection/", {**body, "signature": sim.sign(b"something else")}, follow=True)
    assert "bad_signature" in refused.content.decode()
    done = client.post("/admin/llm/modelselection/", body, follow=True)
    html = done.content.decode()
    assert "pending_restart" in html and "takes effect after the service is restarted" in html
    row = ModelSelection.objects.get(kind="vad")
    assert (row.selected_key, row.effective_key) == ("silero-vad@6.1", "silero-vad@6")
    model_settings.forget_process_models()
    voice_services.open_session(sim.device, "phone_app")
    html = client.get("/admin/llm/modelselection/").content.decode()
    row_html = html[html.index('class="kind-vad"') :].split("</tr>")[0]
    assert '<td class="previous">silero-vad@6</td>' in row_html and '<td class="effective">silero-vad@6.1</td>' in row_html


@pytest.mark.django_db(transaction=True)
async def test_a_device_lists_the_catalog_and_switches_a_model_with_a_signed_frame(voice_catalog: dict[str, Any], make_device: Any, tmp_path: Path) -> None:
    from channels.db import database_sync_to_async

    from tests.conftest import open_socket, receive_until

    sim = await database_sync_to_async(make_device)()
    copy = tmp_path / "vad-2.onnx"
    shutil.copy(voice_catalog["vad_model"], copy)
    await database_sync_to_async(add_entries)(voice_catalog, entry("vad", "silero-vad", "6.1", {"model": str(copy)}))
    comm, _ = await open_socket(sim)
    await comm.send_json_to({"type": "model.catalog", "id": "c"})
    listing = await receive_until(comm, "model.catalog")
    vad = {m["version"]: m for m in listing["models"] if m["kind"] == "vad"}
    assert vad["6"]["effective"] and not vad["6.1"]["selected"] and vad["6.1"]["digest_summary"]
    switch = await database_sync_to_async(signed)(sim, "vad", "silero-vad", "6.1")
    frame = {"type": "model.switch", "id": "s", "kind": "vad", "model_id": "silero-vad", "version": "6.1",
             "issued_at": switch.issued_at, "nonce": switch.nonce}
    await comm.send_json_to({**frame, "signature": sim.sign(b"not the switch")})
    assert (await receive_until(comm, "error"))["code"] == "bad_signature"
    await comm.send_json_to({**frame, "signature": switch.signature})
    done = await receive_until(comm, "model.switch.ok")
    assert (done["state"], done["selected"], done["effective"]) == ("pending_restart", "silero-vad@6.1", "silero-vad@6")
    await comm.disconnect()
