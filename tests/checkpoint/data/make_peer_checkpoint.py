"""Writes peer_tiny/: a checkpoint trained by onnxruntime-training 1.19.2 (the peer), for tests/checkpoint/test_peer.py.

Run with the peer's environment (``python bench/run.py --setup-only`` creates it):

    bench/.peer-venv/bin/python tests/checkpoint/data/make_peer_checkpoint.py

Files: ``tiny.onnx`` (the forward model: Gemm, Relu, Gemm; ``fc2.bias`` frozen), ``checkpoint`` (the peer's, after 3
AdamW steps at learning rate 0.01, with properties), ``expected.npz`` (the parameters and AdamW moments the peer
holds then, the batch, and the parameters after one more peer step on the same batch).
"""

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.training import artifacts
from onnxruntime.training.api import CheckpointState, Module, Optimizer

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_tiny")
PARAMS = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


def forward_model(rng) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "fc1.weight"),
             numpy_helper.from_array(np.zeros(4, np.float32), "fc1.bias"),
             numpy_helper.from_array(rng.standard_normal((2, 4)).astype(np.float32), "fc2.weight"),
             numpy_helper.from_array(np.full(2, 0.5, np.float32), "fc2.bias")]
    nodes = [helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "fc2.weight", "fc2.bias"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def moments(path: str) -> dict[str, np.ndarray]:
    """The AdamW moments in the peer's checkpoint, read with the peer's own flatbuffers classes."""
    sys.path.append(os.path.join(os.path.dirname(artifacts.__file__), "..", "tools", "ort_format_model"))
    from ort_flatbuffers_py.fbs.Checkpoint import Checkpoint

    with open(path, "rb") as f:
        root = Checkpoint.GetRootAs(f.read(), 0)
    group, out = root.OptimizerGroups(0), {}
    for i in range(group.OptimizerStatesLength()):
        state = group.OptimizerStates(i)
        for k in range(state.MomentumsLength()):
            t = state.Momentums(k)
            out[f"{state.ParamName().decode()}/{t.Name().decode()}"] = (
                t.RawDataAsNumpy().view(np.float32).reshape(t.DimsAsNumpy()))
    return out


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(0)
    model = forward_model(rng)
    onnx.save(model, os.path.join(OUT, "tiny.onnx"))
    work = os.path.join(OUT, "peer_artifacts")
    os.makedirs(work, exist_ok=True)
    artifacts.generate_artifacts(model, requires_grad=PARAMS[:3], frozen_params=PARAMS[3:],
                                 loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
                                 artifact_directory=work)
    optimizer_model = onnx.load(os.path.join(work, "optimizer_model.onnx"))
    optimizer_model.ir_version = 10  # the peer writes onnx's newest IR version, which its own onnxruntime refuses
    onnx.save(optimizer_model, os.path.join(work, "optimizer_model.onnx"))
    state = CheckpointState.load_checkpoint(os.path.join(work, "checkpoint"))
    module = Module(os.path.join(work, "training_model.onnx"), state, os.path.join(work, "eval_model.onnx"))
    optimizer = Optimizer(os.path.join(work, "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(0.01)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    y = np.array([0, 1, 1, 0, 1], np.int64)
    for _ in range(3):
        module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
    state.properties["epoch"] = 3
    state.properties["best_loss"] = 0.25
    state.properties["user"] = "alice"
    path = os.path.join(OUT, "checkpoint")
    CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)
    expected = {f"param/{n}": state.parameters[n].data.copy() for n in PARAMS}
    expected.update({f"moment/{k}": v for k, v in moments(path).items()})
    module(x, y)
    optimizer.step()
    expected.update({f"next/{n}": state.parameters[n].data.copy() for n in PARAMS})
    np.savez(os.path.join(OUT, "expected.npz"), x=x, y=y, **expected)
    for name in os.listdir(work):
        os.remove(os.path.join(work, name))
    os.rmdir(work)


if __name__ == "__main__":
    main()
