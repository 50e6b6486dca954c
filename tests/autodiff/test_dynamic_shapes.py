"""No rule needs a static dimension the forward op does not need.

Every row of the rule table runs again with its first input declared with symbolic dimensions only (as a
model exported with dynamic batch, spatial and sequence axes declares it): the gradient graph must build,
match finite differences, and run on onnxruntime. Weights (the other inputs) keep their static shapes, as
initializers do in real models.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from tests.autodiff.test_rules import ROWS, Row

from onnxtrain.autodiff.check import check_gradients, gradient_model, run_model, single_node_model
from onnxtrain.errors import UnsupportedOpError

# Refused with a clear error: a fixed output_shape with a dynamic input size contradicts itself.
NOT_DYNAMIC: dict[str, str] = {"ConvTranspose-output_shape": "output_shape"}


# Axes that are part of an op's data layout rather than a size a model varies (DFT's real/complex component).
LAYOUT_AXES = {"DFT": [-1], "STFT": [-1]}


def _symbolic_first_input(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its first graph input's dimensions renamed to symbols (but its layout axes) and every
    other shape inferred again from there (the outputs' declared shapes are dropped)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    first = model.graph.input[0]
    dims = first.type.tensor_type.shape.dim
    keep = {a % len(dims) for a in LAYOUT_AXES.get(model.graph.node[0].op_type, [])}
    for i, dim in enumerate(dims):
        if i in keep:
            continue
        dim.Clear()
        dim.dim_param = f"d{i}"
    for out in model.graph.output:
        out.type.tensor_type.ClearField("shape")
    return model


def _row_model(r: Row) -> onnx.ModelProto:
    return single_node_model(r.op, r.inputs, n_outputs=r.outputs, opset=r.opset, constant_inputs=r.consts,
                             input_order=r.order, **r.attrs)


DYNAMIC_ROWS = [pytest.param(r, id=r.id) for r in ROWS if np.asarray(next(iter(r.inputs.values()))).ndim > 0]


@pytest.mark.parametrize("r", DYNAMIC_ROWS)
def test_rule_with_symbolic_dimensions(r: Row):
    model = _symbolic_first_input(_row_model(r))
    wrt = [k for k, v in r.inputs.items() if np.issubdtype(np.asarray(v).dtype, np.floating)]
    if r.id in NOT_DYNAMIC:
        with pytest.raises(UnsupportedOpError, match=NOT_DYNAMIC[r.id]):
            check_gradients(model, r.inputs, wrt)
        return
    report = check_gradients(model, r.inputs, wrt, eps=r.eps, rtol=r.rtol, atol=r.atol, backend=r.backend)
    assert report.ok, f"{r.id} with symbolic dims: {report}"


@pytest.mark.parametrize("r", DYNAMIC_ROWS)
def test_symbolic_gradient_graph_runs_on_onnxruntime(r: Row):
    """The float32 gradient graph, built with symbolic dims, on onnxruntime against the float64 reference."""
    import onnxruntime as ort

    if r.id in NOT_DYNAMIC:
        pytest.skip("refused with a clear error (see test_rule_with_symbolic_dimensions)")
    model64 = _symbolic_first_input(_row_model(r))
    inputs32 = _float32(r.inputs)
    model32 = _symbolic_first_input(single_node_model(r.op, inputs32, n_outputs=r.outputs, opset=r.opset,
                                                      constant_inputs=_float32(r.consts), input_order=r.order,
                                                      **r.attrs))
    try:
        ort.InferenceSession(model32.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"onnxruntime cannot run the forward {r.op} itself: {str(e).splitlines()[0][:120]}")
    outs = run_model(model64, r.inputs)
    weights = {o.name: np.random.default_rng(7).standard_normal(np.shape(v)).astype(v.dtype)
               for o, v in zip(model64.graph.output, outs) if np.issubdtype(v.dtype, np.floating)}
    wrt = [k for k, v in r.inputs.items() if np.issubdtype(np.asarray(v).dtype, np.floating)]
    expected = run_model(gradient_model(model64, wrt, weights), r.inputs)[1:]
    got = run_model(gradient_model(model32, wrt, _float32(weights)), inputs32, backend="ort")[1:]
    for name, e, g in zip(wrt, expected, got):
        assert np.shape(g) == np.shape(inputs32[name]), f"{r.id}: d{name} has shape {np.shape(g)}"
        scale = float(np.abs(e).max()) if np.size(e) else 1.0
        np.testing.assert_allclose(g, e, rtol=2e-3, atol=2e-4 * (1 + scale), err_msg=f"{r.id}: d{name} on onnxruntime")


def _float32(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=np.float32) if np.asarray(v).dtype == np.float64 else np.asarray(v)
            for k, v in values.items()}


def _residual_inputs(size, rng):
    return {"x": rng.standard_normal((2, 2, *size)), "w1": rng.standard_normal((2, 2, 3, 3)),
            "w2": rng.standard_normal((3, 2, 3, 3)), "w3": rng.standard_normal((3, 2, 1, 1))}


@pytest.mark.parametrize("size", [(7, 9), (8, 6)])
def test_residual_blocks_with_dynamic_spatial_axes(size):
    """Adds joining convolution and pool branches of run-time size: the gradients match finite differences at
    odd and even sizes."""
    from tests.ir.test_symbolic import _residual_cnn

    inputs = _residual_inputs(size, np.random.default_rng(0))
    report = check_gradients(_residual_cnn(), inputs, list(inputs), kink_tol=1e-3)
    assert report.ok, str(report)


def test_residual_blocks_reduce_no_axis_at_run_time(tmp_path):
    """The sizes are named after the input's (ir.symbolic.solve_windows), so the training graph has no reduction
    over axes computed at run time (a NonZero per reduction before)."""
    from onnx import numpy_helper
    from tests.ir.test_symbolic import _residual_cnn

    from onnxtrain import artifacts

    model = _residual_cnn(onnx.TensorProto.FLOAT)
    weights = {k: v.astype(np.float32) for k, v in _residual_inputs((8, 8), np.random.default_rng(0)).items()
               if k != "x"}
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in weights.items())
    del model.graph.input[1:]
    artifacts.generate_artifacts(model, requires_grad=list(weights), loss=artifacts.LossType.MSELoss,
                                 artifact_directory=str(tmp_path))
    training = onnx.load(str(tmp_path / "training_model.onnx"))
    assert not [n.name for n in training.graph.node if n.op_type == "NonZero"]
