"""Cold pack benchmark: an hour of speech-like PCM through the L5P1 format and a real WebDAV
server (wsgidav on cheroot, loopback).

    .venv/bin/python bench/archive.py [--minutes 60] [--object-seconds 10] [--reads 200]

1. Speech-like audio: sentences spoken by espeak-ng (English and Chinese voices), resampled
   to 16 kHz mono s16 by ffmpeg, 0.3 s of silence between them, looped to ``--minutes``.
2. Cut into originals of ``--object-seconds`` (the hot store's archive batches are 0.5 s;
   ``--batch-minutes`` of those are measured apart: many small streams per ffmpeg call) and
   sealed into packs near 8 MiB twice: FLAC (the real codec choice) and everything gzip
   level 1 (what the pack would be without FLAC). Size and sealing time for each.
3. Verification: every pack decoded whole and every chunk checked (× real time).
4. Upload and read back through WebDAV, then ``--reads`` random originals read with one
   range request each: the range GET alone and range GET + decode + check, p50/p99, beside
   the floor measured in the same run: a range GET of 16 bytes of a tiny file on the same
   server.

ffmpeg runs as in production: ``nice -n 19``, one thread. Prints one table. Benchmarks are
never assertions in the test suite.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import percentile  # noqa: E402
from memory.archive import coldpack  # noqa: E402
from memory.archive.webdav import WebDAV  # noqa: E402
from tests.support.webdav_support import PASSWORD, USER, WsgiDAVServer  # noqa: E402

RATE = 16000
BYTES_PER_SECOND = RATE * 2
SEAL_BYTES = 8 * 1024 * 1024
SENTENCES = [
    ("en", "Remind me to call my mother after the meeting tomorrow afternoon."),
    ("en", "The coffee shop on the corner had a green sign and a long queue."),
    ("en", "Could you send the invoice to Alice before Friday, please?"),
    ("en", "I think the train leaves from platform four at a quarter past seven."),
    ("en", "We walked past the bakery and the flower market near the river."),
    ("en", "Turn the living room lights down a little and play something quiet."),
    ("cmn", "刚才那家店叫什么名字，我想明天再去一次。"),
    ("cmn", "帮我记一下，周末要和妈妈一起去买菜。"),
    ("cmn", "今天下午的会议改到三点，地点还是原来的会议室。"),
    ("cmn", "路过山茶咖啡的时候，看到他们的招牌换成了绿色。"),
]


def speech(minutes: float, workdir: Path) -> bytes:
    """``minutes`` of 16 kHz mono s16 speech: the sentences, each followed by 0.3 s of silence, looped."""
    parts = []
    for i, (voice, text) in enumerate(SENTENCES):
        wav = workdir / f"s{i}.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", "160", "-w", str(wav), text], check=True, capture_output=True)
        pcm = subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-i", str(wav), "-ar", str(RATE), "-ac", "1",
                              "-f", "s16le", "pipe:1"], check=True, capture_output=True).stdout
        parts.append(pcm + bytes(int(0.3 * BYTES_PER_SECOND)))
    one = b"".join(parts)
    need = int(minutes * 60 * BYTES_PER_SECOND)
    return (one * (need // len(one) + 1))[:need]


def originals(audio: bytes, seconds: float) -> list[bytes]:
    size = int(seconds * BYTES_PER_SECOND)
    return [audio[i : i + size] for i in range(0, len(audio), size)]


def seal_all(objects: list[bytes], codec: str) -> tuple[list[bytes], float]:
    """Packs sealed near 8 MiB as the migration seals them (``memory.archive.cold_store._seal``):
    originals coded in groups of up to ``FFMPEG_GROUP``, a group ending once its raw bytes
    would take the pack to 8 MiB; (packs, seconds spent)."""
    packs: list[bytes] = []
    started = time.perf_counter()
    builder = coldpack.PackBuilder()
    group: list[tuple[str, str, bytes]] = []
    raw = 0
    for i, data in enumerate(objects):
        group.append((str(i), codec, data))
        raw += len(data)
        if len(group) >= coldpack.FFMPEG_GROUP or builder.size + raw >= SEAL_BYTES or i == len(objects) - 1:
            builder.add_many(group)
            group, raw = [], 0
            if builder.size >= SEAL_BYTES or i == len(objects) - 1:
                packs.append(builder.seal())
                builder = coldpack.PackBuilder()
    return packs, time.perf_counter() - started


def verify_all(packs: list[bytes]) -> float:
    started = time.perf_counter()
    for pack in packs:
        for _chunk, _data in coldpack.decode_pack(pack):
            pass
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--object-seconds", type=float, default=10.0)
    parser.add_argument("--batch-minutes", type=float, default=10.0, help="audio measured as 0.5 s archive batches")
    parser.add_argument("--reads", type=int, default=200)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="yimi-bench-archive-") as tmp:
        audio = speech(args.minutes, Path(tmp))
    seconds = len(audio) / BYTES_PER_SECOND
    objects = originals(audio, args.object_seconds)
    rows: list[tuple[str, str]] = []
    print(f"audio: {seconds / 60:.1f} min of espeak-ng speech, 16 kHz mono s16, {len(audio) / 2**20:.1f} MiB, "
          f"{len(objects)} originals of {args.object_seconds:g} s", flush=True)

    flac_packs, flac_seal = seal_all(objects, "pcm_s16le_16k_mono")
    gzip_packs, gzip_seal = seal_all(objects, "application/octet-stream")
    flac_size, gzip_size = sum(map(len, flac_packs)), sum(map(len, gzip_packs))
    rows += [
        ("pack size, FLAC", f"{flac_size / 2**20:.1f} MiB in {len(flac_packs)} packs ({flac_size / len(audio):.1%} of raw)"),
        ("pack size, gzip-1", f"{gzip_size / 2**20:.1f} MiB in {len(gzip_packs)} packs ({gzip_size / len(audio):.1%} of raw)"),
        ("seal, FLAC", f"{flac_seal:.1f} s = {seconds / flac_seal:.0f}x real time"),
        ("seal, gzip-1", f"{gzip_seal:.1f} s = {seconds / gzip_seal:.0f}x real time"),
    ]
    flac_verify = verify_all(flac_packs)
    rows.append(("verify (decode + check), FLAC", f"{flac_verify:.1f} s = {seconds / flac_verify:.0f}x real time"))
    gzip_verify = verify_all(gzip_packs)
    rows.append(("verify (decode + check), gzip-1", f"{gzip_verify:.1f} s = {seconds / gzip_verify:.0f}x real time"))

    batches = originals(audio[: int(args.batch_minutes * 60 * BYTES_PER_SECOND)], 0.5)
    batch_packs, batch_seal = seal_all(batches, "pcm_s16le_16k_mono")
    batch_seconds = sum(map(len, batches)) / BYTES_PER_SECOND
    batch_verify = verify_all(batch_packs)
    rows.append((f"seal, FLAC, 0.5 s batches ({len(batches)})", f"{batch_seal:.1f} s = {batch_seconds / batch_seal:.0f}x real time "
                 f"({batch_seal / len(batches) * 1000:.0f} ms per batch)"))
    rows.append(("verify, FLAC, 0.5 s batches", f"{batch_verify:.1f} s = {batch_seconds / batch_verify:.0f}x real time"))

    server = WsgiDAVServer().start()
    try:
        with WebDAV(server.url, USER, PASSWORD) as dav:
            started = time.perf_counter()
            for i, pack in enumerate(flac_packs):
                dav.put(f"p{i}.l5p", pack)
            put_s = time.perf_counter() - started
            started = time.perf_counter()
            for i, pack in enumerate(flac_packs):
                if dav.get(f"p{i}.l5p") != pack:
                    raise SystemExit("read back differs")
            get_s = time.perf_counter() - started
            rows.append(("upload (PUT), FLAC packs", f"{put_s:.1f} s = {flac_size / 2**20 / put_s:.0f} MiB/s"))
            rows.append(("read back (GET), FLAC packs", f"{get_s:.1f} s = {flac_size / 2**20 / get_s:.0f} MiB/s"))
            dav.put("tiny", b"0123456789abcdef0123456789abcdef")
            headers = [coldpack.decode_header(p) for p in flac_packs]
            index = [(i, c) for i, h in enumerate(headers) for c in h.chunks]
            picks = [random.Random(7).choice(index) for _ in range(args.reads)]
            floor, ranged, whole = [], [], []
            for i, chunk in picks:  # interleaved: the three see the same machine load
                t = time.perf_counter()
                dav.get_range("tiny", 8, 16)
                floor.append(time.perf_counter() - t)
                start = headers[i].data_start + chunk.offset
                t = time.perf_counter()
                data = dav.get_range(f"p{i}.l5p", start, chunk.size)
                ranged.append(time.perf_counter() - t)
                t = time.perf_counter()
                coldpack.decode_chunk(chunk, dav.get_range(f"p{i}.l5p", start, chunk.size))
                whole.append(time.perf_counter() - t)
                assert len(data) == chunk.size
    finally:
        server.close()

    def ms(samples: list[float]) -> str:
        return f"p50 {percentile(samples, 0.5) * 1000:.1f} ms, p99 {percentile(samples, 0.99) * 1000:.1f} ms"

    rows += [
        ("floor: range GET of 16 bytes", ms(floor)),
        (f"range GET of one original ({args.object_seconds:g} s FLAC chunk)", ms(ranged)),
        ("range GET + FLAC decode + SHA-256 check", ms(whole)),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"{'measure':<{width}}  result")
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
