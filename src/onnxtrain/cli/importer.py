"""`onnxtrain import MODEL.tflite|MODEL.circle -o model.onnx`: a forward ONNX model to train.

Float32 TensorFlow Lite and circle models; initializers keep the TFLite tensor names and layouts. The model
remembers its source file, so after `generate` and `train`, `onnxtrain export DIR --format tflite|circle`
writes the trained weights into a copy of it (see docs/tflite.md).

`onnxtrain import PEER_CHECKPOINT --artifacts DIR -o NEW_CHECKPOINT`: a checkpoint written by onnxruntime-training
(the weights a device trained with it), carried into onnxtrain's checkpoint of DIR, artifacts generated from the
same forward model: parameters, AdamW moments, step and properties, so that training resumes where it stopped.
"""

from __future__ import annotations

import argparse
import os

from onnxtrain.cli.common import CliError, human_bytes, shape_text

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("import", help="convert a .tflite or .circle model to ONNX for training, or an "
                       "onnxruntime-training checkpoint to onnxtrain's", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL.tflite|MODEL.circle|PEER_CHECKPOINT",
                   help="a float32 TensorFlow Lite or circle model, or an onnxruntime-training checkpoint")
    p.add_argument("-o", "--output", required=True, metavar="OUTPUT",
                   help="the ONNX model to write (for a checkpoint: the onnxtrain checkpoint to write)")
    p.add_argument("--artifacts", metavar="DIR", help="for a checkpoint: onnxtrain's artifacts generated from the same "
                   "forward model (their checkpoint gives the layout)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    folder = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"cannot write {args.output}: the folder {folder} does not exist")
    with open(args.model, "rb") as file:
        head = file.read(8)
    from onnxtrain.checkpoint.peer import is_peer_checkpoint

    if is_peer_checkpoint(head):
        return _import_checkpoint(args)
    if args.artifacts:
        raise CliError(f"--artifacts is for onnxruntime-training checkpoints; {args.model} is not one")
    from onnxtrain.tflite.importer import import_model
    from onnxtrain.tflite.source import SourceRecord

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


def _import_checkpoint(args: argparse.Namespace) -> int:
    from onnxtrain.checkpoint import import_peer_checkpoint, save_checkpoint
    from onnxtrain.conventions import artifact_file

    if not args.artifacts:
        raise CliError(f"{args.model} is an onnxruntime-training checkpoint: pass --artifacts DIR, onnxtrain's "
                       "artifacts generated from the same forward model")
    template = os.path.join(args.artifacts, artifact_file("checkpoint"))
    data = import_peer_checkpoint(args.model, template)
    save_checkpoint(data, args.output, include_optimizer_state=True)
    moments = sum(len(states) for states in data.optimizer.values())
    print(f"wrote {args.output} ({human_bytes(os.path.getsize(args.output))}) from {args.model}: "
          f"{len(data.trainable)} trainable, {len(data.frozen)} frozen, {len(data.buffers)} buffers, "
          f"{moments} optimizer states, step {data.step}, {len(data.properties)} properties")
    return 0
