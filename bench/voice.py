"""Voice benchmark: real-time factor of VAD + speaker embedding on one core, and how many
concurrent voice streams one worker sustains in real time; the TTS time to first audio byte;
the ASR speed of faster-whisper tiny.en on one core (``--asr-only``; needs the voice extra).

    .venv/bin/python bench/voice.py [--seconds 60] [--streams-seconds 10]

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
    (``devices.voice.tts.Espeak``: child process, WAV parse, resampling to 16 kHz, as the
    voice socket runs it), p50/p95 over ``rounds`` sentences. The floor: starting and
    reaping a child process that does nothing (``true``), the part no synthesizer in a
    child process can avoid."""
    import asyncio

    from devices.voice.tts import Espeak

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
    extra; ``brain/catalogs/voice-default.json``), on one core with one thread, greedy, as
    the voice socket runs it (``devices.voice.probe.whisper_transcribe``): each espeak-ng
    sentence is one utterance. Printed as audio seconds per wall second (above 1: faster
    than real time) and as RTF (wall / audio). The floor, in the same run: reading the WAV
    files and converting them to float samples, the part every engine needs."""
    from brain.catalog import check_entry, parse_catalog
    from devices.voice.probe import build, whisper_transcribe

    listed = [e for e in parse_catalog((ROOT / "brain" / "catalogs" / "voice-default.json").read_text()) if e.kind == "asr"]
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

    whisper_transcribe(model, read(paths[0]), entry.metadata)  # warm up
    audio_s = wall_asr = wall_floor = 0.0
    heard = total = 0
    for _ in range(rounds):
        for path, text in zip(paths, SENTENCES, strict=True):
            t0 = time.perf_counter()
            samples = read(path)
            t1 = time.perf_counter()
            got = whisper_transcribe(model, samples, entry.metadata)
            t2 = time.perf_counter()
            wall_floor += t1 - t0
            wall_asr += t2 - t0
            audio_s += samples.size / 16000
            said = {w.strip(".,?!").lower() for w in text.split()}
            heard += len(said & {w.strip(".,?!").lower() for w in got.split()})
            total += len(said)
    print(f"\nASR: faster-whisper {entry.key} (int8, 1 CPU, 1 thread, greedy), {len(SENTENCES)} sentences × {rounds} = {audio_s:.1f} s of speech; model load {loaded:.2f} s")
    print(f"{'':<28} {'audio s / wall s':>17} {'RTF':>8}")
    print(f"{'read WAV + transcribe':<28} {audio_s / wall_asr:>17.2f} {wall_asr / audio_s:>8.4f}")
    print(f"{'floor: read WAV':<28} {audio_s / wall_floor:>17.0f} {wall_floor / audio_s:>8.5f}")
    print(f"words of the sentences found in the transcripts: {heard}/{total}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="audio for the real-time factor")
    parser.add_argument("--streams-seconds", type=float, default=5.0, help="audio per stream in the concurrency test")
    parser.add_argument("--tts-rounds", type=int, default=40, help="sentences for the TTS time to first audio byte")
    parser.add_argument("--tts-only", action="store_true", help="only the TTS time to first audio byte")
    parser.add_argument("--asr-rounds", type=int, default=3, help="passes over the sentences for the ASR speed")
    parser.add_argument("--asr-only", action="store_true", help="only the ASR speed (tiny.en, the voice extra)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="yimi-bench-voice-"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "yimi_project.settings")
    os.environ.setdefault("YIMI_DATA_DIR", str(work / "data"))
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
    import importlib.util
    import threading

    from brain.catalog import parse_catalog
    from devices.voice.engines import SpeakerEmbedder
    from devices.voice.probe import build
    from devices.voice.session import VoiceSession
    from tests.voice_support import build_speaker_model

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
