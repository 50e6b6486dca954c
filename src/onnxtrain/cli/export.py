"""`onnxtrain export DIR -o model.onnx`: an inference model with the trained weights inside.

The exported model is plain ONNX (no loss, no labels); it is checked by loading it into an
onnxruntime.InferenceSession before the command reports success. For a model imported from a .tflite or
.circle file, `--format tflite|circle -o trained.tflite` writes the trained weights into a copy of that
file instead (same graph and operators; the file travels in the artifacts' metadata).
"""

from __future__ import annotations

import argparse
import os

from onnxtrain.cli.common import Artifacts, CliError, human_bytes, quiet_onnxruntime, read_model, shape_text

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="write an inference model with the trained weights", description=__doc__)
    p.add_argument("dir", metavar="DIR", help="the artifact folder")
    p.add_argument("-o", "--output", required=True, metavar="MODEL.onnx",
                   help="the inference model to write (with --adapter: the adapter folder)")
    p.add_argument("--outputs", nargs="+", metavar="NAME", help="graph outputs (default: the model's outputs)")
    p.add_argument("--checkpoint", metavar="last|best|initial|PATH",
                   help="which weights (default: the last training checkpoint, else the initial one)")
    p.add_argument("--prefix", default="", help="the file-name prefix given to generate")
    p.add_argument("--merge-adapters", action="store_true", help="fold LoRA adapters into their weights")
    p.add_argument("--format", choices=("onnx", "tflite", "circle"), default="onnx",
                   help="onnx (default), or for a model imported from .tflite/.circle: that flatbuffer with the "
                        "trained weights")
    p.add_argument("--source", metavar="MODEL.onnx", help="with --format tflite|circle: the model written by "
                   "`onnxtrain import` (default: the flatbuffer recorded in the artifacts)")
    p.add_argument("--adapter", action="store_true", help="write only the LoRA adapters (and other trained "
                   "tensors) as a Hugging Face PEFT folder: adapter_model.safetensors + adapter_config.json")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import onnxruntime as ort

    from onnxtrain.api import CheckpointState, Module

    artifacts = Artifacts.locate(args.dir, args.prefix)
    checkpoint = artifacts.resolve_checkpoint(args.checkpoint)
    if args.adapter:
        from onnxtrain.cli.lora import export_adapter

        paths = export_adapter(artifacts.training, checkpoint, args.output)
        print(f"wrote {', '.join(os.path.basename(p) for p in paths.values())} to {args.output} from {checkpoint}")
        return 0
    quiet_onnxruntime()
    own = [f for f in (artifacts.training, artifacts.eval, artifacts.optimizer, artifacts.checkpoint, checkpoint)
           if f and os.path.exists(args.output) and os.path.samefile(f, args.output)]
    if own:
        raise CliError(f"-o {args.output} is one of the artifacts' own files; write the inference model elsewhere "
                       "(e.g. -o model_trained.onnx)")
    folder = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"cannot write {args.output}: the folder {folder} does not exist")
    if args.format != "onnx":
        from onnxtrain.tflite.export import export_flatbuffer

        source = read_model(args.source, "imported model") if args.source else None
        report = export_flatbuffer(artifacts.training, artifacts.eval, checkpoint, args.output, args.format, source)
        print(f"{report.summary()} from {checkpoint}")
        return 0
    state = CheckpointState.load_checkpoint(checkpoint)
    module = Module(read_model(artifacts.training, "training model"), state, read_model(artifacts.eval, "eval model"))
    module.export_model_for_inferencing(args.output, args.outputs, merge_adapters=args.merge_adapters)
    session = ort.InferenceSession(args.output, providers=["CPUExecutionProvider"])
    io = lambda values: ", ".join(f"{v.name}: {v.type}{shape_text(v.shape)}" for v in values)  # noqa: E731
    print(f"wrote {args.output} ({human_bytes(os.path.getsize(args.output))}) from {checkpoint}")
    print(f"inputs:  {io(session.get_inputs())}")
    print(f"outputs: {io(session.get_outputs())}")
    return 0
