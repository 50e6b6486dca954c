"""ScatterIntoGradient (runtime/passes/scatter_gradient.py): an embedding's gradient is scattered into its
gradient buffer instead of into a tensor of zeros; training (with resets and accumulation) is unchanged."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import blocks
from onnxtrain import conventions as names
from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.conventions import TrainingMeta
from onnxtrain.errors import PassError
from onnxtrain.runtime import run as run_module
from onnxtrain.runtime.passes import ScatterIntoGradient, SpecializeReset, zeroed_before_run

VOCAB, DIM, SEQ, CLASSES = 11, 6, 5, 3


def _embedding_model(rows: int = VOCAB, dim: int = DIM, seq: int = SEQ) -> onnx.ModelProto:
    """ids [batch, seq] -> Gather(emb [rows, dim]) -> ReduceMean over the sequence -> Gemm -> logits."""
    rng = np.random.default_rng(0)
    weights = {"emb": rng.standard_normal((rows, dim)).astype(np.float32),
               "fc.weight": rng.standard_normal((CLASSES, dim)).astype(np.float32),
               "fc.bias": np.zeros(CLASSES, np.float32)}
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"]),
             helper.make_node("ReduceMean", ["e"], ["m"], axes=[1], keepdims=0),
             helper.make_node("Gemm", ["m", "fc.weight", "fc.bias"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "embedding", [helper.make_tensor_value_info("ids", TensorProto.INT64,
                                                                                 ["batch", seq])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
                              initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


class _Refused:
    def __init__(self, *args):
        pass

    def __call__(self, model):
        raise PassError("disabled by the test")

    run = __call__  # the runtime runs its passes without the checker's postconditions


def _train(folder, fuse: bool):
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state)
    opt = Optimizer(folder / "optimizer_model.onnx", module)
    module.training_run.fuse = fuse
    rng = np.random.default_rng(1)
    batch = lambda: (rng.integers(0, VOCAB, (4, SEQ)), rng.integers(0, CLASSES, 4))  # noqa: E731
    for calls in (1, 1, 2, 1, 3, 1):  # resets and accumulation; ids repeat within a batch
        for _ in range(calls):
            module(*batch())
        opt.step()
        module.lazy_reset_grad()
    module(*batch())  # a last call without a step: the gradient itself is compared too
    return ({n: p.data.copy() for n, p in state.parameters.items()},
            {n: p.grad.copy() for n, p in state.parameters.items()})


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "separate"])
def test_scattering_into_the_buffer_trains_as_scattering_into_zeros(tmp_path, monkeypatch, fuse):
    generate_artifacts(_embedding_model(), requires_grad=["emb", "fc.weight", "fc.bias"],
                       loss=LossType.CrossEntropyLoss, optimizer=blocks.AdamW(), artifact_directory=tmp_path)
    params, grads = _train(tmp_path, fuse)
    monkeypatch.setattr(run_module, "ScatterIntoGradient", _Refused)
    zeros_params, zeros_grads = _train(tmp_path, fuse)
    initial = CheckpointState.load_checkpoint(tmp_path / "checkpoint").parameters
    for name in params:
        np.testing.assert_allclose(params[name], zeros_params[name], rtol=1e-6, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(grads[name], zeros_grads[name], rtol=1e-6, atol=1e-7, err_msg=name)
        assert not np.allclose(params[name], initial[name].data), name


@pytest.mark.parametrize("reset", [True, False])
def test_the_embedding_gradient_reads_no_zeros(tmp_path, reset):
    paths = generate_artifacts(_embedding_model(), requires_grad=["emb", "fc.weight"],
                               loss=LossType.CrossEntropyLoss, artifact_directory=tmp_path)
    train = onnx.load(paths["training"])
    meta = TrainingMeta.from_model(train)
    specialised = SpecializeReset(meta.accumulation, reset)(train).model
    before = [n.op_type for n in specialised.graph.node]
    model = ScatterIntoGradient(meta.trainable, reset)(specialised).model
    producer = {o: n for n in model.graph.node for o in n.output}
    scatter = producer[names.grad_output_name("emb")]
    assert scatter.op_type == "ScatterElements" and scatter.input[0] == names.grad_buffer_name("emb")
    assert "ConstantOfShape" not in [n.op_type for n in model.graph.node]
    assert "ConstantOfShape" in before
    if reset:  # the only buffer a reset graph reads is the one it scatters into
        assert zeroed_before_run(model, meta.trainable) == ["emb"]


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "separate"])
def test_an_embedding_shared_by_every_token_gets_the_same_gradient_at_one_and_four_threads(tmp_path, fuse):
    """BERT's token types: 1,024 lookups of one row. onnxruntime's multi-threaded ScatterND lost about half of
    them; the gradient scattered into the buffer must be the one-thread one, and training reproducible."""
    import onnxruntime as ort

    generate_artifacts(_embedding_model(2, 384, 128), requires_grad=["emb", "fc.weight", "fc.bias"],
                       loss=LossType.CrossEntropyLoss, optimizer=blocks.AdamW(), artifact_directory=tmp_path)
    ids, labels = np.zeros((8, 128), np.int64), np.arange(8) % CLASSES

    def train(threads: int) -> tuple[np.ndarray, np.ndarray]:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
        module = Module(tmp_path / "training_model.onnx", state, session_options=options)
        module.training_run.fuse = fuse
        opt = Optimizer(tmp_path / "optimizer_model.onnx", module)
        for _ in range(3):
            module(ids, labels)
            opt.step()
            module.lazy_reset_grad()
        module(ids, labels)
        return state.parameters["emb"].grad.copy(), state.parameters["emb"].data.copy()

    grad_1, data_1 = train(1)
    assert np.abs(grad_1[0]).max() > 0
    for _ in range(2):
        grad_4, data_4 = train(4)
        np.testing.assert_allclose(grad_4, grad_1, rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(data_4, data_1, rtol=1e-5, atol=1e-7)
