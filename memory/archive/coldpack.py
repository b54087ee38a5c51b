"""The cold pack format ``L5P1`` (docs/memory.md "Cold packs"): many raw objects in one
file on WebDAV, each readable alone with one HTTP range request.

Layout::

    b"L5P1" | header length (4 bytes, big-endian) | gzip(canonical JSON header) | chunks

The header is canonical JSON (sorted keys, no spaces, UTF-8), gzip-compressed with mtime 0
so the same objects always make the same bytes::

    {"format": "L5P1", "chunks": [{"id": "...", "codec": "flac"|"gzip", "offset": 0,
      "size": ..., "decoded_size": ..., "sha256": "<of the decoded bytes>"}, ...]}

``offset`` counts from the first byte after the header; a chunk's byte range in the file is
``data_start + offset`` for ``size`` bytes. Only lossless codecs: a word not understood
today is analysed again from the original with a better model later. 16-bit PCM
(``pcm_s16le``) chunks are FLAC, made and read by ffmpeg as a low-priority (``nice -n
19``), single-thread process given at most ``FFMPEG_SECONDS`` (30 s) per call; everything
else is gzip level 1.

Limits, checked when sealing and again when reading: a pack decodes to at most
``MAX_DECODED_BYTES`` (64 MiB), is at most ``MAX_PACK_BYTES`` (80 MiB) on the wire, and its
header is at most ``MAX_HEADER_BYTES`` (1 MiB) before and after compression. The decoder
checks every chunk it decodes: its size and SHA-256 against the header, before any byte is
handed out (``pack_invalid`` otherwise).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yimi_project.errors import YimiError

MAGIC = b"L5P1"
PREFIX_BYTES = 8
MAX_DECODED_BYTES = 64 * 1024 * 1024
MAX_PACK_BYTES = 80 * 1024 * 1024
MAX_HEADER_BYTES = 1024 * 1024
FFMPEG_SECONDS = 30.0
FFMPEG_GROUP = 64  # streams per ffmpeg call
FFMPEG_GROUP_BYTES = 16 * 1024 * 1024  # PCM per ffmpeg call: FLAC codes it in a few seconds
FLAC, GZIP = "flac", "gzip"
# "pcm_s16le", "pcm_s16le_16k_mono", "pcm_s16le_48k_stereo" (the hot store's names).
PCM16_CODEC = re.compile(r"^pcm_s16le(?:_(\d{1,3})k)?(?:_(mono|stereo))?$")


@dataclass(frozen=True)
class Chunk:
    """One object's entry in a pack header."""

    id: str
    codec: str
    offset: int  # from the first byte after the header
    size: int
    decoded_size: int
    sha256: str  # of the decoded (original) bytes

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "codec": self.codec, "offset": self.offset, "size": self.size,
                "decoded_size": self.decoded_size, "sha256": self.sha256}


@dataclass(frozen=True)
class Header:
    chunks: list[Chunk]
    data_start: int  # PREFIX_BYTES + compressed header length

    def chunk(self, object_id: str) -> Chunk:
        for chunk in self.chunks:
            if chunk.id == object_id:
                return chunk
        raise YimiError("not_found", f"object {object_id} is not in this pack")

    @property
    def decoded_size(self) -> int:
        return sum(c.decoded_size for c in self.chunks)


def invalid(message: str) -> YimiError:
    return YimiError("pack_invalid", message)


# --- FLAC through ffmpeg ---------------------------------------------------------------------------


FFMPEG_MISSING = "ffmpeg is not installed (apt-get install ffmpeg): audio originals cannot be sealed into cold packs"


def _ffmpeg(args: list[str], data: bytes) -> bytes:
    """Run ffmpeg at the lowest CPU priority on one thread, ``data`` on stdin, stdout back.
    Raises ``ffmpeg_missing`` (not installed), ``flac_failed`` (ffmpeg refused) or
    ``flac_timeout`` (over ``FFMPEG_SECONDS``; the process is killed)."""
    if shutil.which("ffmpeg") is None:
        raise YimiError("ffmpeg_missing", FFMPEG_MISSING)
    argv = ["nice", "-n", "19", "ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-threads", "1", *args]
    try:
        done = subprocess.run(argv, input=data, capture_output=True, timeout=FFMPEG_SECONDS, check=False)
    except subprocess.TimeoutExpired as exc:
        raise YimiError("flac_timeout", f"ffmpeg took longer than {FFMPEG_SECONDS:g} s") from exc
    if done.returncode != 0:
        raise YimiError("flac_failed", f"ffmpeg failed: {done.stderr.decode(errors='replace')[-300:]}")
    return done.stdout


ENCODE_OUT = ["-map_metadata", "-1", "-c:a", "flac", "-f", "flac"]
DECODE_OUT = ["-f", "s16le", "-c:a", "pcm_s16le"]


def _pcm_in(rate: int, channels: int) -> list[str]:
    return ["-f", "s16le", "-ar", str(rate), "-ac", str(channels)]


def flac_encode(pcm: bytes, *, rate: int = 16000, channels: int = 1) -> bytes:
    return _ffmpeg([*_pcm_in(rate, channels), "-i", "pipe:0", *ENCODE_OUT, "pipe:1"], pcm)


def flac_decode(flac: bytes) -> bytes:
    return _ffmpeg(["-f", "flac", "-i", "pipe:0", *DECODE_OUT, "pipe:1"], flac)


def _ffmpeg_many(inputs: list[tuple[list[str], bytes]], out_args: list[str]) -> list[bytes]:
    """One ffmpeg call for many separate streams: input ``i`` (its format options and
    bytes, written to a private temporary file) becomes output ``i``. Starting ffmpeg costs
    far more than coding half a second of audio (0.25-0.4 s on a loaded 2-core machine), so
    a pack of short archive batches is coded in groups instead of one call per batch."""
    with tempfile.TemporaryDirectory(prefix="yimi-flac-") as tmp:
        argv: list[str] = []
        for i, (in_args, data) in enumerate(inputs):
            path = Path(tmp) / f"in{i}"
            path.write_bytes(data)
            argv += [*in_args, "-i", str(path)]
        for i in range(len(inputs)):
            argv += ["-map", f"{i}:a", *out_args, str(Path(tmp) / f"out{i}")]
        _ffmpeg(argv, b"")
        return [(Path(tmp) / f"out{i}").read_bytes() for i in range(len(inputs))]


def _groups(sizes: list[int]) -> Iterator[list[int]]:
    """Indexes in groups of at most ``FFMPEG_GROUP`` items and ``FFMPEG_GROUP_BYTES`` (a
    group must finish well within ``FFMPEG_SECONDS``)."""
    group: list[int] = []
    total = 0
    for i, size in enumerate(sizes):
        if group and (len(group) >= FFMPEG_GROUP or total + size > FFMPEG_GROUP_BYTES):
            yield group
            group, total = [], 0
        group.append(i)
        total += size
    if group:
        yield group


def flac_encode_many(items: list[tuple[bytes, int, int]]) -> list[bytes]:
    """FLAC of each (pcm, rate, channels), in as few ffmpeg calls as the group bounds allow."""
    out: list[bytes] = [b""] * len(items)
    for group in _groups([len(pcm) for pcm, _r, _c in items]):
        encoded = _ffmpeg_many([(_pcm_in(items[i][1], items[i][2]), items[i][0]) for i in group], ENCODE_OUT)
        for i, data in zip(group, encoded, strict=True):
            out[i] = data
    return out


def flac_decode_many(items: list[tuple[bytes, int]]) -> list[bytes]:
    """PCM of each (flac, decoded size), grouped like ``flac_encode_many``."""
    out: list[bytes] = [b""] * len(items)
    for group in _groups([size for _f, size in items]):
        decoded = _ffmpeg_many([(["-f", "flac"], items[i][0]) for i in group], DECODE_OUT)
        for i, data in zip(group, decoded, strict=True):
            out[i] = data
    return out


def pcm16_format(codec: str) -> tuple[int, int] | None:
    """(rate, channels) when ``codec`` names 16-bit little-endian PCM (``pcm_s16le``,
    optionally with ``_16k`` and ``_mono``/``_stereo``; 16 kHz mono unless said), else None.
    The rate only labels the FLAC stream: decoding gives back the same samples either way."""
    match = PCM16_CODEC.match(codec)
    if match is None:
        return None
    return int(match.group(1) or 16) * 1000, 2 if match.group(2) == "stereo" else 1


# --- chunks --------------------------------------------------------------------------------------


def _flac_format(codec: str, data: bytes) -> tuple[int, int] | None:
    pcm = pcm16_format(codec)
    return pcm if pcm is not None and data and len(data) % (2 * pcm[1]) == 0 else None


def encode_chunk(codec: str, data: bytes) -> tuple[str, bytes]:
    """(pack codec, encoded bytes) for one object's original bytes."""
    return encode_chunks([(codec, data)])[0]


def encode_chunks(items: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """``encode_chunk`` for many objects: the FLAC ones in grouped ffmpeg calls."""
    formats = [_flac_format(codec, data) for codec, data in items]
    flac_at = [i for i, f in enumerate(formats) if f is not None]
    flacs = flac_encode_many([(items[i][1], *formats[i]) for i in flac_at])  # type: ignore[misc]
    out = [(GZIP, gzip.compress(data, compresslevel=1, mtime=0)) if f is None else (FLAC, b"") for (_c, data), f in zip(items, formats, strict=True)]
    for i, data in zip(flac_at, flacs, strict=True):
        out[i] = (FLAC, data)
    return out


def _gunzip(data: bytes, limit: int) -> bytes:
    """Decompress at most ``limit`` + 1 bytes: a chunk that claims less than it holds is
    caught without inflating all of it."""
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise invalid(f"gzip chunk is corrupt: {exc}") from exc
    return out


def decode_chunk(chunk: Chunk, data: bytes) -> bytes:
    """The original bytes of ``chunk`` from its encoded ``data``, checked against the
    header's size and SHA-256 (``pack_invalid`` on any mismatch)."""
    return decode_chunks([(chunk, data)])[0]


def decode_chunks(items: list[tuple[Chunk, bytes]]) -> list[bytes]:
    """``decode_chunk`` for many chunks: the FLAC ones in grouped ffmpeg calls. A group
    ffmpeg refuses is decoded again one chunk at a time, so the error names the chunk."""
    for chunk, data in items:
        if len(data) != chunk.size:
            raise invalid(f"chunk {chunk.id} is {len(data)} bytes, the header says {chunk.size}")
        if chunk.codec not in (GZIP, FLAC):
            raise invalid(f"chunk {chunk.id} has unknown codec {chunk.codec!r}")
    flac_at = [i for i, (chunk, _d) in enumerate(items) if chunk.codec == FLAC]
    try:
        flacs = flac_decode_many([(items[i][1], items[i][0].decoded_size) for i in flac_at])
    except YimiError as exc:
        if exc.code != "flac_failed":
            raise
        flacs = [_flac_decode_one(items[i][0], items[i][1]) for i in flac_at]
    decoded = dict(zip(flac_at, flacs, strict=True))
    return [_checked(chunk, decoded[i] if i in decoded else _gunzip(data, chunk.decoded_size))
            for i, (chunk, data) in enumerate(items)]


def _flac_decode_one(chunk: Chunk, data: bytes) -> bytes:
    try:
        return flac_decode(data)
    except YimiError as exc:
        if exc.code == "flac_failed":
            raise invalid(f"chunk {chunk.id}: {exc.message}") from exc
        raise


def _checked(chunk: Chunk, out: bytes) -> bytes:
    if len(out) != chunk.decoded_size:
        raise invalid(f"chunk {chunk.id} decodes to {len(out)} bytes, the header says {chunk.decoded_size}")
    if hashlib.sha256(out).hexdigest() != chunk.sha256:
        raise invalid(f"chunk {chunk.id} does not match its SHA-256")
    return out


# --- header --------------------------------------------------------------------------------------


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def encode_header(chunks: list[Chunk]) -> bytes:
    """The 8-byte prefix and the compressed header; ``header_too_large`` over 1 MiB."""
    raw = canonical_json({"format": "L5P1", "chunks": [c.as_json() for c in chunks]})
    if len(raw) > MAX_HEADER_BYTES:
        raise YimiError("header_too_large", f"pack header is {len(raw)} bytes before compression (at most {MAX_HEADER_BYTES})")
    packed = gzip.compress(raw, compresslevel=9, mtime=0)
    if len(packed) > MAX_HEADER_BYTES:
        raise YimiError("header_too_large", f"pack header is {len(packed)} bytes compressed (at most {MAX_HEADER_BYTES})")
    return MAGIC + struct.pack(">I", len(packed)) + packed


def header_length(prefix: bytes) -> int:
    """The compressed header's length from a pack's first 8 bytes."""
    if len(prefix) < PREFIX_BYTES or prefix[:4] != MAGIC:
        raise invalid("not an L5P1 pack (bad magic)")
    (length,) = struct.unpack(">I", prefix[4:8])
    if length > MAX_HEADER_BYTES:
        raise invalid(f"pack header is {length} bytes compressed (at most {MAX_HEADER_BYTES})")
    return int(length)


def _int(entry: dict[str, Any], key: str) -> int:
    value = entry.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise invalid(f"chunk field {key} must be a non-negative integer")
    return value


def decode_header(head: bytes) -> Header:
    """Parse and check the header from the pack's first ``8 + length`` bytes (or more):
    sizes within the limits, chunks in order without gaps or overlaps."""
    length = header_length(head)
    if len(head) < PREFIX_BYTES + length:
        raise invalid("pack is shorter than its header")
    raw = _gunzip(head[PREFIX_BYTES : PREFIX_BYTES + length], MAX_HEADER_BYTES)
    if len(raw) > MAX_HEADER_BYTES:
        raise invalid(f"pack header is over {MAX_HEADER_BYTES} bytes before compression")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise invalid("pack header is not JSON") from exc
    if not isinstance(body, dict) or body.get("format") != "L5P1" or not isinstance(body.get("chunks"), list):
        raise invalid("pack header is not an L5P1 header")
    chunks, expected_offset, decoded = [], 0, 0
    for entry in body["chunks"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or not isinstance(entry.get("sha256"), str):
            raise invalid("pack header chunk is malformed")
        chunk = Chunk(entry["id"], str(entry.get("codec")), _int(entry, "offset"), _int(entry, "size"),
                      _int(entry, "decoded_size"), entry["sha256"])
        if chunk.offset != expected_offset:
            raise invalid(f"chunk {chunk.id} is at offset {chunk.offset}, expected {expected_offset}")
        expected_offset += chunk.size
        decoded += chunk.decoded_size
        chunks.append(chunk)
    if decoded > MAX_DECODED_BYTES:
        raise invalid(f"pack decodes to {decoded} bytes (at most {MAX_DECODED_BYTES})")
    if PREFIX_BYTES + length + expected_offset > MAX_PACK_BYTES:
        raise invalid(f"pack is over {MAX_PACK_BYTES} bytes")
    return Header(chunks, PREFIX_BYTES + length)


def decode_pack(data: bytes) -> Iterator[tuple[Chunk, bytes]]:
    """Every chunk of a whole pack with its original bytes, each checked; the pack must end
    exactly where its last chunk does."""
    header = decode_header(data)
    end = header.data_start + sum(c.size for c in header.chunks)
    if len(data) != end:
        raise invalid(f"pack is {len(data)} bytes, its header accounts for {end}")
    items = [(chunk, data[header.data_start + chunk.offset : header.data_start + chunk.offset + chunk.size]) for chunk in header.chunks]
    yield from zip(header.chunks, decode_chunks(items), strict=True)


# --- sealing -------------------------------------------------------------------------------------


@dataclass
class PackBuilder:
    """Collects encoded chunks until sealed. ``add`` refuses (``pack_full``) a chunk that
    would take the pack over the decoded or transfer limit or the object count; callers
    seal when ``size`` reaches their target."""

    max_objects: int = 2048
    chunks: list[Chunk] = field(default_factory=list)
    parts: list[bytes] = field(default_factory=list, repr=False)
    size: int = 0  # encoded chunk bytes so far
    decoded_size: int = 0

    def fits(self, decoded_size: int) -> bool:
        return len(self.chunks) < self.max_objects and self.decoded_size + decoded_size <= MAX_DECODED_BYTES

    def add(self, object_id: str, codec: str, data: bytes) -> Chunk:
        return self.add_many([(object_id, codec, data)])[0]

    def add_many(self, items: list[tuple[str, str, bytes]]) -> list[Chunk]:
        """Add (object id, codec, original bytes) in order, encoded together (FLAC ones in
        grouped ffmpeg calls). ``pack_full`` before anything is added if they do not fit."""
        if len(self.chunks) + len(items) > self.max_objects or self.decoded_size + sum(len(d) for _i, _c, d in items) > MAX_DECODED_BYTES:
            raise YimiError("pack_full", "these objects do not fit in this pack")
        encoded = encode_chunks([(codec, data) for _i, codec, data in items])
        return [self.add_encoded(oid, pack_codec, enc, len(data), hashlib.sha256(data).hexdigest())
                for (oid, _codec, data), (pack_codec, enc) in zip(items, encoded, strict=True)]

    def add_encoded(self, object_id: str, codec: str, encoded: bytes, decoded_size: int, sha256: str) -> Chunk:
        """Add a chunk already in its pack codec (a pack rewritten after an erasure copies
        the chunks it keeps without decoding them again)."""
        if not self.fits(decoded_size):
            raise YimiError("pack_full", f"object {object_id} does not fit in this pack")
        if PREFIX_BYTES + self.size + len(encoded) > MAX_PACK_BYTES:
            raise YimiError("pack_full", f"object {object_id} would take the pack over {MAX_PACK_BYTES} bytes")
        chunk = Chunk(object_id, codec, self.size, len(encoded), decoded_size, sha256)
        self.chunks.append(chunk)
        self.parts.append(encoded)
        self.size += len(encoded)
        self.decoded_size += decoded_size
        return chunk

    def seal(self) -> bytes:
        """The whole pack file. ``pack_empty`` with no chunk; ``header_too_large`` or
        ``pack_too_large`` over the limits."""
        if not self.chunks:
            raise YimiError("pack_empty", "a pack needs at least one object")
        head = encode_header(self.chunks)
        if len(head) + self.size > MAX_PACK_BYTES:
            raise YimiError("pack_too_large", f"pack would be {len(head) + self.size} bytes (at most {MAX_PACK_BYTES})")
        return head + b"".join(self.parts)
