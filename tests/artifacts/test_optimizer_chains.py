"""Optimizers are chains of transforms (blocks/transforms.py): the aliases pick and order them, the chain
collects the states they declare, and an update written as one function still works."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from onnxtrain import blocks
from onnxtrain.artifacts.optimizer import build_optimizer_model
from onnxtrain.blocks import transforms as T

PARAMS = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}


def _kinds(optimizer):
    return [type(t).__name__ for t in optimizer.transforms()]


def test_adamw_modes_are_two_chains():
    hf = blocks.AdamW(weight_decay=0.01, max_norm=1.0)
    torch = blocks.AdamW(weight_decay=0.01, max_norm=1.0, mode="torch")
    assert _kinds(hf) == ["ClipByGlobalNorm", "ScaleByAdamPeer", "ScaleByLearningRate", "DecayWeights"]
    assert _kinds(torch) == ["ClipByGlobalNorm", "DecayWeights", "ScaleByAdam", "ScaleByLearningRate"]
    assert hf.state_names == torch.state_names == ("exp_avg", "exp_avg_sq")


@pytest.mark.parametrize("optimizer, states", [
    (blocks.SGD(), ()), (blocks.SGD(momentum=0.9, weight_decay=0.1), ("momentum_buffer",)),
    (blocks.Adam(weight_decay=0.1), ("exp_avg", "exp_avg_sq")),
])
def test_the_chain_declares_the_states(optimizer, states):
    assert optimizer.state_names == states
    model = build_optimizer_model(optimizer, PARAMS, 17)
    assert [i.name for i in model.graph.input][4:] == list(states)


def _run(optimizer, lr=0.1):
    session = ort.InferenceSession(build_optimizer_model(optimizer, PARAMS, 17).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal(9).astype(np.float32) for i in session.get_inputs()}
    feeds.update(learning_rate=np.array(lr, np.float32), step=np.array(1, np.int64))
    return feeds, session.run(None, feeds)


def test_an_update_written_as_one_function_still_works():
    class HeavyBall(blocks.Optimizer):
        state_names = ("velocity",)

        def update(self, p, g, states, lr, step):
            v = self.op.Add(self.op.Mul(states["velocity"], self.builder.const(np.float32(0.5))), g)
            return self.op.Sub(p, self.op.Mul(v, lr)), {"velocity": v}

    feeds, (params, velocity, *_) = _run(HeavyBall())
    expected_velocity = 0.5 * feeds["velocity"] + feeds["gradients"]
    np.testing.assert_allclose(velocity, expected_velocity, rtol=1e-6)
    np.testing.assert_allclose(params, feeds["params"] - 0.1 * expected_velocity, rtol=1e-6)


def test_a_custom_chain():
    class SignSGD(blocks.Optimizer):
        def transforms(self):
            return [Sign(), T.ScaleByLearningRate()]

    class Sign(T.Transform):
        def apply(self, u):
            u.direction = u.op.Sign(u.direction)

    feeds, (params, *_) = _run(SignSGD())
    np.testing.assert_allclose(params, feeds["params"] - 0.1 * np.sign(feeds["gradients"]), rtol=1e-6)


def test_a_declared_state_left_unset_is_a_clear_error():
    class Forgetful(T.Transform):
        state_names = ("trace",)

        def apply(self, u):
            pass

    class Broken(blocks.Optimizer):
        def transforms(self):
            return [Forgetful(), T.ScaleByLearningRate()]

    with pytest.raises(ValueError, match=r"declares the states \['trace'\] but no transform set"):
        build_optimizer_model(Broken(), PARAMS, 17)
