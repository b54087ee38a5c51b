"""What the voice tests need, all real and made on the spot (never committed binaries):

- speech from espeak-ng (+ sox to 16 kHz mono 16-bit), one voice for the owner and others
  for guests and for the "population" the speaker model is centred on;
- a tiny but real speaker-embedding ONNX model that sherpa-onnx loads (it must carry the
  metadata sherpa-onnx reads, ``framework``, ``output_dim``, ...: without it the process dies): the
  utterance's mean log-mel spectrum, with its overall level removed, minus the mean of
  a background population of voices. Same speaker → high cosine, another voice → low;
- the Silero VAD model shipped in the ``silero-vad`` wheel;
- a catalog file naming them with their real SHA-256 digests;
- a local OpenAI-compatible ``/v1/embeddings`` server (the embedding model's "own runtime").
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import threading
import wave
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import need

OWNER_VOICE = ("en+m3", 40)
GUEST_VOICE = ("en+f3", 70)
BACKGROUND_VOICES = [("en+m2", 50), ("en+f1", 60), ("en+m5", 45), ("en+f4", 65), ("en-us", 50)]
SENTENCES = [
    "Hello Yimi, what is the weather like tomorrow?",
    "Please remind me to call my mother at six.",
    "Read me the latest news about the football match.",
    "How long does it take to drive to the airport today?",
    "Turn off the lights in the living room please.",
    "What did I say about the meeting on Monday morning?",
    "Order a large pizza with mushrooms for dinner tonight.",
    "Play some quiet piano music while I am cooking.",
]
SPEAKER_METADATA = {"framework": "wespeaker", "sample_rate": "16000", "normalize_samples": "1", "language": "en"}


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def silero_vad_path() -> str:
    spec = importlib.util.find_spec("silero_vad")
    need(spec is not None and spec.submodule_search_locations is not None, "silero-vad wheel not installed (pip install --no-deps silero-vad)")
    assert spec is not None and spec.submodule_search_locations is not None
    return os.path.join(spec.submodule_search_locations[0], "data", "silero_vad.onnx")


# --- speech ------------------------------------------------------------------------------------


class Speech:
    """espeak-ng speech, cached per (text, voice, pitch) in one directory."""

    def __init__(self, directory: Path) -> None:
        need(shutil.which("espeak-ng") is not None and shutil.which("sox") is not None, "espeak-ng and sox are needed (apt-get install espeak-ng sox)")
        self.directory = directory
        self._cache: dict[tuple[str, str, int], np.ndarray] = {}

    def say(self, text: str, voice: tuple[str, int] = OWNER_VOICE) -> np.ndarray:
        key = (text, voice[0], voice[1])
        if key not in self._cache:
            stem = hashlib.sha1(repr(key).encode()).hexdigest()[:16]
            raw, out = self.directory / f"{stem}.raw.wav", self.directory / f"{stem}.wav"
            subprocess.run(["espeak-ng", "-v", voice[0], "-p", str(voice[1]), "-s", "160", "-w", str(raw), text], check=True)
            subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(out)], check=True)
            with wave.open(str(out)) as w:
                self._cache[key] = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0
        return self._cache[key]


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(16000 * seconds), dtype=np.float32)


def pcm(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1.0, 32767 / 32768) * 32768.0).astype("<i2").tobytes()


def frames(samples: np.ndarray, frame_samples: int = 3200) -> Iterator[bytes]:
    """200-ms binary frames, as a device streams them."""
    data = pcm(samples)
    step = frame_samples * 2
    for i in range(0, len(data), step):
        yield data[i : i + step]


# --- the speaker-embedding model -------------------------------------------------------------------


def build_speaker_model(path: str | Path, *, bias: np.ndarray | None = None, metadata: dict[str, str] | None = None, dim: int = 80) -> str:
    """``x [N, T, 80] fbank → mean over T → minus its mean over the 80 bands → minus bias →
    [N, 80]``. ``metadata`` replaces the default metadata (use it to build bad models)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 80])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", dim])
    inits = [
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        numpy_helper.from_array((np.zeros(80) if bias is None else bias).astype(np.float32), "bias"),
        numpy_helper.from_array(np.eye(80, dim, dtype=np.float32), "W"),
    ]
    nodes = [
        helper.make_node("ReduceMean", ["x", "axis1"], ["m"], keepdims=0),
        helper.make_node("ReduceMean", ["m", "axis1"], ["level"], keepdims=1),
        helper.make_node("Sub", ["m", "level"], ["shape"]),
        helper.make_node("Sub", ["shape", "bias"], ["centred"]),
        helper.make_node("MatMul", ["centred", "W"], ["y"]),
    ]
    model = helper.make_model(helper.make_graph(nodes, "speaker", [x], [y], inits), opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    meta = {**SPEAKER_METADATA, "output_dim": str(dim)} if metadata is None else metadata
    for key, value in meta.items():
        prop = model.metadata_props.add()
        prop.key, prop.value = key, value
    onnx.save(model, str(path))
    return str(path)


def population_bias(speech: Speech, directory: Path) -> np.ndarray:
    """The mean spectral shape of the background voices (computed through sherpa-onnx)."""
    import sherpa_onnx

    probe = build_speaker_model(directory / "population-probe.onnx")
    extractor = sherpa_onnx.SpeakerEmbeddingExtractor(sherpa_onnx.SpeakerEmbeddingExtractorConfig(model=probe, num_threads=1))
    rows = []
    for voice in BACKGROUND_VOICES:
        for text in SENTENCES[:3]:
            stream = extractor.create_stream()
            stream.accept_waveform(sample_rate=16000, waveform=speech.say(text, voice))
            stream.input_finished()
            rows.append(np.asarray(extractor.compute(stream)))
    return np.mean(rows, axis=0)


# --- catalog ------------------------------------------------------------------------------------------


def entry(kind: str, model_id: str, version: str, files: dict[str, str], metadata: dict[str, Any] | None = None, default: bool = False) -> dict[str, Any]:
    return {
        "kind": kind, "id": model_id, "version": version, "default": default,
        "files": {role: {"path": str(p), "sha256": sha256(p)} for role, p in files.items()},
        "metadata": metadata or {},
    }


def write_catalog(path: Path, entries: list[dict[str, Any]]) -> str:
    path.write_text(json.dumps(entries))
    return str(path)


@pytest.fixture(scope="session")
def voice_assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Speech generator, the speaker model and the VAD model, built once per test session."""
    directory = tmp_path_factory.mktemp("voice-assets")
    speech = Speech(directory)
    model = build_speaker_model(directory / "speaker-v1.onnx", bias=population_bias(speech, directory))
    return {"speech": speech, "speaker_model": model, "vad_model": silero_vad_path(), "dir": directory}


@pytest.fixture
def voice_catalog(voice_assets: dict[str, Any], tmp_path: Path, settings: Any) -> Iterator[dict[str, Any]]:
    """A catalog with the Silero VAD and the test speaker model, configured for this test."""
    from llm import model_settings

    entries = [
        entry("vad", "silero-vad", "6", {"model": voice_assets["vad_model"]}, default=True),
        entry("voiceprint", "test-speaker", "1", {"model": voice_assets["speaker_model"]}, {"output_dim": 80}, default=True),
    ]
    settings.YIMI_LOCAL_CATALOG_FILE = write_catalog(tmp_path / "catalog.json", entries)
    model_settings.forget_process_models()
    yield {"path": tmp_path / "catalog.json", "entries": entries, **voice_assets}
    model_settings.forget_process_models()


def embed(samples: np.ndarray) -> np.ndarray:
    """The effective voiceprint model's embedding of ``samples`` (through sherpa-onnx)."""
    from llm import model_settings
    from voice import engines

    entry_ = model_settings.effective_entry("voiceprint")
    assert entry_ is not None
    return engines.speaker_embedder(entry_).embed(samples)


def unit_with_cosine(base: np.ndarray, cos: float, seed: int = 0) -> np.ndarray:
    """A unit vector at exactly ``cos`` from ``base`` (for the band boundaries)."""
    b = base / np.linalg.norm(base)
    rng = np.random.default_rng(seed)
    r = rng.standard_normal(b.size)
    r -= r.dot(b) * b
    r /= np.linalg.norm(r)
    return cos * b + np.sqrt(max(0.0, 1 - cos * cos)) * r


# --- the embedding model's own runtime (OpenAI-compatible /v1/embeddings) ------------------------------


class EmbeddingsServer(ThreadingHTTPServer):
    """Deterministic character-trigram hashing vectors; ``fail`` makes it answer 500."""

    def __init__(self, dim: int) -> None:
        self.dim, self.fail, self.calls = dim, False, 0
        super().__init__(("127.0.0.1", 0), _EmbeddingsHandler)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def vector(self, text: str) -> list[float]:
        v = np.zeros(self.dim)
        for i in range(max(1, len(text) - 2)):
            h = int(hashlib.md5(text[i : i + 3].encode()).hexdigest(), 16)
            v[h % self.dim] += 1.0 if (h >> 64) & 1 else -1.0
        return v.tolist()


class _EmbeddingsHandler(BaseHTTPRequestHandler):
    server: EmbeddingsServer

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.calls += 1
        if self.server.fail or self.path != "/v1/embeddings":
            self.send_response(500)
            self.end_headers()
            return
        data = [{"object": "embedding", "index": i, "embedding": self.server.vector(t)} for i, t in enumerate(body["input"])]
        payload = json.dumps({"object": "list", "data": data, "model": body["model"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def embeddings_server() -> Iterator[EmbeddingsServer]:
    server = EmbeddingsServer(dim=16)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
