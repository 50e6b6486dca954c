"""onnxblock.optim: the peer's sequence-based optimizer models, checked against the update math in numpy."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxtrain.onnxblock as onnxblock

SHAPES = [(3, 4), (4,), (2, 3)]


def _parameters(rng):
    trainable = [onnx.numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), f"p{i}")
                 for i, s in enumerate(SHAPES)]
    return trainable, []


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _clip(grads, max_norm):
    norm = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads))
    return [g * min(1.0, max_norm / (norm + 1e-6)) for g in grads]


@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_grad_norm_over_a_sequence(max_norm):
    class Clip(onnxblock.ForwardBlock):
        def __init__(self):
            super().__init__()
            self.clip = onnxblock.optim.ClipGradNorm(max_norm)

        def build(self, grads):
            return self.clip(grads)

    block = Clip()
    with onnxblock.empty_base() as accessor:
        accessor.model.graph.input.append(
            onnx.helper.make_tensor_sequence_value_info("gradients", onnx.TensorProto.FLOAT, None))
        out = block("gradients")
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    (clipped,) = _session(block.to_model_proto()).run([out], {"gradients": grads})
    for got, want in zip(clipped, _clip(grads, max_norm)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("clip", [None, 0.5])
def test_adamw_updates_every_tensor_of_the_sequences(clip):
    rng = np.random.default_rng(1)
    parameters = _parameters(rng)
    optimizer = onnxblock.optim.AdamW(weight_decay=0.01, clip_grad=clip and onnxblock.optim.ClipGradNorm(clip))
    with onnxblock.empty_base() as accessor:
        flag = optimizer(parameters)
        model = accessor.model
    assert [o.name for o in model.graph.output] == [
        "updated_flag", "params.out", "first_order_moments.out", "second_order_moments.out"]
    params = [onnx.numpy_helper.to_array(p) for p in parameters[0]]
    grads = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    m = [rng.standard_normal(s).astype(np.float32) * 0.1 for s in SHAPES]
    v = [np.abs(rng.standard_normal(s)).astype(np.float32) * 0.1 for s in SHAPES]
    lr, step, (b1, b2), eps, wd = 0.01, 3, (0.9, 0.999), 1e-6, 0.01
    flag_value, new_p, new_m, new_v = _session(model).run(None, {
        "learning_rate": np.array([lr], np.float32), "step": np.array([step], np.int64), "params": params,
        "gradients": grads, "first_order_moments": m, "second_order_moments": v})
    assert flag == "updated_flag" and flag_value.tolist() == [True]
    if clip:
        grads = _clip(grads, clip)
    for p, g, m0, v0, p1, m1, v1 in zip(params, grads, m, v, new_p, new_m, new_v):
        m_ref = b1 * m0 + (1 - b1) * g
        v_ref = b2 * v0 + (1 - b2) * g * g
        step_size = lr * np.sqrt(1 - b2 ** step) / (1 - b1 ** step)   # the peer's (hf) AdamW
        p_ref = (p - m_ref / (np.sqrt(v_ref) + eps) * step_size) * (1 - lr * wd)
        np.testing.assert_allclose(m1, m_ref, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(v1, v_ref, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(p1, p_ref, rtol=1e-5, atol=1e-6)
        assert p1.shape == p.shape


def test_sgd_takes_learning_rate_params_and_gradients():
    rng = np.random.default_rng(2)
    parameters = _parameters(rng)
    with onnxblock.empty_base() as accessor:
        onnxblock.optim.SGD()(parameters)
        model = accessor.model
    assert [i.name for i in model.graph.input] == ["learning_rate", "params", "gradients"]
    params = [onnx.numpy_helper.to_array(p) for p in parameters[0]]
    grads = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    _, new_p = _session(model).run(None, {"learning_rate": np.array([0.1], np.float32), "params": params,
                                          "gradients": grads})
    for p, g, p1 in zip(params, grads, new_p):
        np.testing.assert_allclose(p1, p - 0.1 * g, rtol=1e-6)


def test_an_optimizer_without_trainable_parameters_is_an_error():
    with onnxblock.empty_base(), pytest.raises(ValueError, match="no trainable parameters"):
        onnxblock.optim.AdamW()(([], []))


@pytest.mark.parametrize("make", [
    lambda: onnxblock.optim.AdamW(weight_decay=0.01, clip_grad=onnxblock.optim.ClipGradNorm(0.5)),
    lambda: onnxblock.optim.AdamW(betas=(0.8, 0.99), eps=1e-8, bias_correction=False),
    lambda: onnxblock.optim.SGD(clip_grad=onnxblock.optim.ClipGradNorm(0.5)),
])
def test_optimizer_runs_an_onnxblock_model_as_its_sequence_update(make, tmp_path):
    """api.Optimizer given an onnxblock.optim model runs the recorded rule as the flat update: three steps give
    what the sequence model itself computes."""
    from onnxtrain.api import CheckpointState, Module, Optimizer
    from tests import models

    class WithLoss(onnxblock.TrainingBlock):
        def __init__(self):
            super().__init__()
            self.loss = onnxblock.loss.MSELoss()

        def build(self, output_name):
            return self.loss(output_name)

    block = WithLoss()
    with onnxblock.base(models.mlp()):
        block("output")
        training, eval_model = block.to_model_proto()
    optimizer_block = make()
    with onnxblock.empty_base():
        optimizer_block(block.parameters())
    sequence_model = optimizer_block.to_model_proto()
    for name, proto in [("training", training), ("eval", eval_model), ("optimizer", sequence_model)]:
        onnx.save(proto, str(tmp_path / f"{name}.onnx"))
    onnxblock.save_checkpoint(block.parameters(), str(tmp_path / "checkpoint"))

    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    module = Module(str(tmp_path / "training.onnx"), state, str(tmp_path / "eval.onnx"))
    optimizer = Optimizer(str(tmp_path / "optimizer.onnx"), module)
    optimizer.set_learning_rate(0.05)
    names = [p.name for p in block.parameters()[0]]
    params = [state.parameters[n].data for n in names]
    moments = [[np.zeros_like(p) for p in params] for _ in range(2)]
    session = _session(sequence_model)
    seq_inputs = {i.name for i in sequence_model.graph.input}
    rng = np.random.default_rng(3)
    for step in range(1, 4):
        module(rng.standard_normal((6, 8)).astype(np.float32), rng.standard_normal((6, 4)).astype(np.float32))
        grads = [state.parameters[n].grad for n in names]
        feeds = {"learning_rate": np.array([0.05], np.float32), "step": np.array([step], np.int64),
                 "params": params, "gradients": grads, "first_order_moments": moments[0],
                 "second_order_moments": moments[1]}
        outs = dict(zip([o.name for o in sequence_model.graph.output],
                        session.run(None, {k: v for k, v in feeds.items() if k in seq_inputs})))
        params = outs["params.out"]
        moments = [outs.get("first_order_moments.out", moments[0]), outs.get("second_order_moments.out", moments[1])]
        optimizer.step()
        module.lazy_reset_grad()
        for n, want in zip(names, params):
            np.testing.assert_allclose(state.parameters[n].data, want, rtol=1e-5, atol=1e-6, err_msg=f"{n}, {step}")
