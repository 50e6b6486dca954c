"""`onnxtrain import MODEL.tflite|MODEL.circle -o model.onnx`: a forward ONNX model to train.

Float32 TensorFlow Lite and circle models; initializers keep the TFLite tensor names and layouts. The model
remembers its source file, so after `generate` and `train`, `onnxtrain export DIR --format tflite|circle`
writes the trained weights into a copy of it (see docs/tflite.md).
"""

from __future__ import annotations

import argparse
import os

from onnxtrain.cli.common import human_bytes, shape_text

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("import", help="convert a .tflite or .circle model to ONNX for training", description=__doc__)
    p.add_argument("model", metavar="MODEL.tflite|MODEL.circle", help="a float32 TensorFlow Lite or circle model")
    p.add_argument("-o", "--output", required=True, metavar="MODEL.onnx", help="the ONNX model to write")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from onnxtrain.tflite.importer import import_model
    from onnxtrain.tflite.source import SourceRecord

    folder = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"cannot write {args.output}: the folder {folder} does not exist")
    model = import_model(args.model, args.output)
    record = SourceRecord.from_model(model)
    def io(values) -> str:
        return ", ".join(f"{v.name}: {shape_text([d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim])}"
                         for v in values)

    print(f"wrote {args.output} ({human_bytes(os.path.getsize(args.output))}) from {args.model} ({record.format}, "
          f"{len(model.graph.node)} ONNX nodes, {len(record.weights)} weight tensors)")
    print(f"inputs:  {io(model.graph.input)}")
    print(f"outputs: {io(model.graph.output)}")
    return 0
