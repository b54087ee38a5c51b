"""Vision benchmark: face detection + embedding time per 1280 × 720 image on one core.

    .venv/bin/python bench/vision.py [--rounds 200]

Images: 1280 × 720 JPEGs (quality 85) made from the test photos (tests/support/data/faces): one with
two faces (Eileen Collins and Grace Hopper side by side), one with one face, one drawn scene
with none. The work per image is the server's own (``voice.faces``): decode, OpenCV's Haar
frontal-face cascade, a crop per face, one onnxruntime call for the faces, and no database.
The process is pinned to one CPU, ``cv2.setNumThreads(1)``, onnxruntime with one intra-op
thread.

Face models (built here with the ``onnx`` package, random weights: the cost is realistic,
the embeddings are not meaningful):
- ``tiny``: the test suite's model (channel means removed, 8 × 8 pooling, a 128-dim projection);
- ``cnn``: a plain 112 × 112 CNN — 3 × 3 convolutions 3→32 /2, 32→64 /2, 2 × 64→64,
  64→128 /2, 2 × 128→128, 128→256 /2, 256→256, global average pooling, a 128-dim
  projection: ~1.4 M parameters and ~0.19 G multiply-adds per face (the script prints
  both), close to the MobileFaceNet-class cost of SFace.

The floor, measured in the same run: decoding the same JPEG (``cv2.imdecode``), which every
image pays before any face work; "ratio" is the p50 of the whole per-image work over the
floor's p50.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def build_cnn(path: Path, dim: int = 128) -> tuple[int, int]:
    """Returns (parameters, multiply-adds per face)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    layers = [(3, 32, 2), (32, 64, 2), (64, 64, 1), (64, 64, 1), (64, 128, 2), (128, 128, 1), (128, 128, 1), (128, 256, 2), (256, 256, 1)]
    inits, nodes, params, macs, side = [], [], 0, 0, 112
    h = "input"
    for i, (cin, cout, stride) in enumerate(layers):
        w = (rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2.0 / (cin * 9))).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(np.zeros(cout, np.float32), f"b{i}")]
        nodes += [
            helper.make_node("Conv", [h, f"w{i}", f"b{i}"], [f"c{i}"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[stride, stride]),
            helper.make_node("Relu", [f"c{i}"], [f"h{i}"]),
        ]
        side //= stride
        params += w.size + cout
        macs += side * side * cout * cin * 9
        h = f"h{i}"
    proj = (rng.standard_normal((256, dim)) / 16).astype(np.float32)
    inits += [numpy_helper.from_array(proj, "proj")]
    nodes += [helper.make_node("GlobalAveragePool", [h], ["gap"]), helper.make_node("Flatten", ["gap"], ["flat"]), helper.make_node("MatMul", ["flat", "proj"], ["embedding"])]
    params += proj.size
    macs += proj.size
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 112, 112])
    y = helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["N", dim])
    model = helper.make_model(helper.make_graph(nodes, "cnn", [x], [y], inits), opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return params, macs


def p(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1000.0, q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200, help="images per measurement")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="yimi-bench-vision-"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "yimi_project.settings")
    os.environ.setdefault("YIMI_DATA_DIR", str(work / "data"))
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    import cv2
    import django

    django.setup()
    cv2.setNumThreads(1)
    from llm.catalog import parse_catalog
    from tests.support.face_support import COLLINS, HOPPER, build_face_model, drawn_scene, face_entry, jpeg, load, on_frame
    from voice import faces

    both = on_frame(load(COLLINS), scale=1.0, at=(0, 100))
    hopper = cv2.resize(load(HOPPER), None, fx=0.9, fy=0.9, interpolation=cv2.INTER_AREA)
    both[100 : 100 + min(hopper.shape[0], 620), 700 : 700 + hopper.shape[1]] = hopper[:620]
    images = {
        "2 faces": jpeg(both),
        "1 face": jpeg(on_frame(load(COLLINS), scale=1.2, at=(400, 0))),
        "no face": jpeg(drawn_scene()),
    }
    tiny = build_face_model(work / "tiny.onnx")
    params, macs = build_cnn(work / "cnn.onnx")
    models = {"tiny": tiny, "cnn": str(work / "cnn.onnx")}

    def model(path: str) -> faces.FaceModel:
        return faces.FaceModel(parse_catalog(json.dumps([face_entry("bench", "1", path)]))[0], threads=1)

    print(f"1280 × 720 JPEG (quality 85), {args.rounds} rounds each, 1 CPU, cv2.setNumThreads(1), onnxruntime 1 thread")
    print(f"cnn: {params / 1e6:.2f} M parameters, {macs / 1e9:.2f} G multiply-adds per face\n")
    header = f"{'image':<9} {'model':<6} {'faces':>5} {'floor p50':>10} {'detect p50':>11} {'embed p50':>10} {'total p50':>10} {'total p99':>10} {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for image_name, data in images.items():
        for model_name, path in models.items():
            face_model = model(path)
            floor, detect, embed, total = [], [], [], []
            found = 0
            for _ in range(args.rounds + 5):
                t0 = time.perf_counter()
                cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
                t1 = time.perf_counter()
                pixels = faces.prepared(faces.decode_image(data))
                boxes = faces.detect_faces(pixels)
                t2 = time.perf_counter()
                face_model.embed([faces.face_crop(pixels, box, face_model.size) for box in boxes])
                t3 = time.perf_counter()
                floor.append(t1 - t0)
                detect.append(t2 - t1)
                embed.append(t3 - t2)
                total.append(t3 - t1)
                found = len(boxes)
            floor, detect, embed, total = (v[5:] for v in (floor, detect, embed, total))  # warm-up dropped
            print(
                f"{image_name:<9} {model_name:<6} {found:>5} {p(floor, 50):>10.2f} {p(detect, 50):>11.2f} {p(embed, 50):>10.2f} "
                f"{p(total, 50):>10.2f} {p(total, 99):>10.2f} {p(total, 50) / p(floor, 50):>6.1f}"
            )
    print("\nms per image. detect = decode + downscale check + Haar cascade; embed = crops + one onnxruntime call for all faces;")
    print("total = detect + embed (the whole per-image face work); floor = cv2.imdecode of the same JPEG alone.")


if __name__ == "__main__":
    main()
