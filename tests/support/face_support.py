"""What the face tests (and bench/vision.py) run on:

- two real photographs (tests/support/data/faces/README.md: Eileen Collins and Grace Hopper, both
  public domain) and new photos of them made by rescaling, shifting onto a 1280 × 720 frame
  and re-encoding;
- a small real ONNX face embedding model built with the ``onnx`` package: the input
  ``[N, 3, 112, 112]`` (RGB, 0-255) minus each channel's mean, 8 × 8 average pooling, a
  fixed random projection to 128 dimensions. It is no face recognizer: it compares the coarse
  light and colour layout of two aligned crops. What the tests prove with it is the service's
  way (detect, crop, embed, compare, thresholds, honesty rules), not recognition accuracy;
- a catalog naming it with its real SHA-256 digest.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np

DATA = Path(__file__).resolve().parent / "data" / "faces"
COLLINS = DATA / "astronaut.png"
HOPPER = DATA / "grace_hopper.jpg"
FRAME = (1280, 720)


def build_face_model(path: str | Path, *, seed: int = 7, dim: int = 128, size: int = 112) -> str:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    pool = 8
    features = 3 * (size // pool) ** 2
    weights = (np.random.default_rng(seed).standard_normal((features, dim)) / np.sqrt(dim)).astype(np.float32)
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, size, size])
    y = helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["N", dim])
    inits = [numpy_helper.from_array(np.array([2, 3], dtype=np.int64), "hw"), numpy_helper.from_array(weights, "W")]
    nodes = [
        helper.make_node("ReduceMean", ["input", "hw"], ["level"], keepdims=1),
        helper.make_node("Sub", ["input", "level"], ["centred"]),
        helper.make_node("AveragePool", ["centred"], ["pooled"], kernel_shape=[pool, pool], strides=[pool, pool]),
        helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "W"], ["embedding"]),
    ]
    model = helper.make_model(helper.make_graph(nodes, "face", [x], [y], inits), opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


def face_entry(model_id: str, version: str, path: str | Path, *, default: bool = True, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "kind": "face", "id": model_id, "version": version, "default": default,
        "files": {"model": {"path": str(path), "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()}},
        "metadata": metadata or {},
    }


def write_catalog(path: Path, entries: list[dict[str, Any]]) -> str:
    path.write_text(json.dumps(entries))
    return str(path)


# --- photos ----------------------------------------------------------------------------------------


def load(path: Path) -> np.ndarray:
    pixels = cv2.imread(str(path), cv2.IMREAD_COLOR)
    assert pixels is not None, path
    return pixels


def on_frame(pixels: np.ndarray, *, scale: float, at: tuple[int, int], size: tuple[int, int] = FRAME, background: int = 90) -> np.ndarray:
    """``pixels`` rescaled and placed at ``at`` (x, y) on a plain frame of ``size``."""
    resized = cv2.resize(pixels, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC)
    frame = np.full((size[1], size[0], 3), background, np.uint8)
    x, y = at
    h, w = min(resized.shape[0], size[1] - y), min(resized.shape[1], size[0] - x)
    frame[y : y + h, x : x + w] = resized[:h, :w]
    return frame


def jpeg(pixels: np.ndarray, quality: int = 85) -> bytes:
    ok, data = cv2.imencode(".jpg", pixels, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return bytes(data)


def png(pixels: np.ndarray) -> bytes:
    ok, data = cv2.imencode(".png", pixels)
    assert ok
    return bytes(data)


def drawn_scene(size: tuple[int, int] = FRAME) -> np.ndarray:
    """A drawn picture with no face: a table, a cup and a window."""
    frame = np.full((size[1], size[0], 3), (200, 220, 235), np.uint8)
    cv2.rectangle(frame, (0, 480), (size[0], size[1]), (60, 90, 140), -1)
    cv2.rectangle(frame, (850, 80), (1150, 360), (240, 200, 150), -1)
    cv2.line(frame, (1000, 80), (1000, 360), (255, 255, 255), 6)
    cv2.ellipse(frame, (400, 470), (90, 30), 0, 0, 360, (250, 250, 250), -1)
    cv2.rectangle(frame, (310, 330), (490, 470), (250, 250, 250), -1)
    cv2.circle(frame, (200, 200), 60, (30, 160, 230), -1)
    return frame


def tilted(pixels: np.ndarray, degrees: float) -> np.ndarray:
    """The photo turned by ``degrees`` around its centre (a tilted head), edges replicated."""
    h, w = pixels.shape[:2]
    turn = cv2.getRotationMatrix2D((w / 2, h / 2), degrees, 1.0)
    return cv2.warpAffine(pixels, turn, (w, h), borderMode=cv2.BORDER_REPLICATE)
