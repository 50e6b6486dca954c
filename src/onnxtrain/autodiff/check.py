"""Numerical gradient checking: compare the gradient graph of a model with central finite differences.

    report = check_gradients(model, {"x": x, "w": w}, wrt=["x", "w"])
    assert report.ok, report

The scalar checked is ``sum_k sum(output_k * r_k)`` with fixed random ``r_k``, so every output element
contributes with a different weight. Run it in float64 with the reference backend for tight tolerances.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from onnxtrain.autodiff.engine import build_gradients
from onnxtrain.ir.builder import GraphBuilder
from onnxtrain.ir.passes import clone, constant_values, default_opset, prune_nodes, used_names
from onnxtrain.ir.types import infer_tensor_info

__all__ = ["GradientReport", "check_gradients", "gradient_model", "run_model", "single_node_model"]


@dataclass
class GradientReport:
    """Per-input worst errors of the analytic gradient against finite differences."""

    errors: dict[str, float] = field(default_factory=dict)     # max |analytic - numeric| / (atol + rtol |numeric|)
    analytic: dict[str, np.ndarray] = field(default_factory=dict)
    numeric: dict[str, np.ndarray] = field(default_factory=dict)   # NaN where an element was not compared
    weights: dict[str, np.ndarray] = field(default_factory=dict)   # output name -> r_k of the checked scalar
    kinks: dict[str, int] = field(default_factory=dict)            # elements skipped as non-differentiable

    @property
    def ok(self) -> bool:
        return all(e <= 1.0 for e in self.errors.values())

    def __str__(self) -> str:
        return ", ".join(f"{k}: {v:.3g}" for k, v in self.errors.items()) + (" (ok)" if self.ok else " (FAILED)")


def single_node_model(op_type: str, inputs: Mapping[str, np.ndarray], n_outputs: int = 1, opset: int = 18,
                      constant_inputs: Mapping[str, np.ndarray] | None = None,
                      input_order: Sequence[str] | None = None, **attrs) -> onnx.ModelProto:
    """A model of one node; ``inputs`` are graph inputs, ``constant_inputs`` initializers (names starting with
    "_omit" are omitted inputs). The node reads inputs then constants, or in ``input_order`` if given."""
    constant_inputs = dict(constant_inputs or {})
    order = list(input_order) if input_order is not None else [*inputs, *constant_inputs]
    names = [n if not n.startswith("_omit") else "" for n in order]
    outs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, **attrs)
    graph_inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                    for k, v in inputs.items()]
    initializers = [onnx.numpy_helper.from_array(v, k) for k, v in constant_inputs.items() if not k.startswith("_omit")]
    graph = helper.make_graph([node], op_type, graph_inputs,
                              [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs],
                              initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset <= 17 else (9 if opset <= 20 else 10)
    inferred = onnx.shape_inference.infer_shapes(model)
    outputs = list(inferred.graph.output)
    if any(o.type.tensor_type.elem_type == onnx.TensorProto.UNDEFINED for o in outputs):
        # Shape inference could not type an output (an op without an inference function): run the model.
        values = run_model(model, {k: np.asarray(v) for k, v in inputs.items()})
        outputs = [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                   for o, v in zip(outs, values)]
    del model.graph.output[:]
    model.graph.output.extend(outputs)
    return model


def gradient_model(model: onnx.ModelProto, wrt: Sequence[str], weights: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """``model`` plus a scalar ``loss = sum_k sum(output_k * weight_k)`` and its gradients ``d_<name>``.

    The outputs are the loss then the gradients, in the order of ``wrt`` (their names get a suffix when the
    model already uses them).
    """
    graph = model.graph
    infos = infer_tensor_info(model)
    opset = default_opset(model)
    b = GraphBuilder(opset, taken=used_names(graph))
    terms = []
    for out in graph.output:
        if out.name in weights:
            w = b.const(weights[out.name], name=f"r_{out.name}")
            terms.append(b.reduce("ReduceSum", b.op.Mul(out.name, w), None, keepdims=False))
    loss = terms[0] if len(terms) == 1 else b.op.Sum(*terms)
    loss_name = b.unique("loss")
    b.node("Identity", [loss], [loss_name])
    nodes = [*map(clone, graph.node), *b.nodes]
    full = helper.make_graph(nodes, "loss", list(graph.input), [], initializer=[*graph.initializer, *b.initializers],
                             value_info=list(graph.output))   # keeps the output types inference may not find
    full_model = helper.make_model(full, opset_imports=list(model.opset_import))
    full_model.ir_version = model.ir_version
    infos = infer_tensor_info(full_model)
    gb = GraphBuilder(opset, taken=used_names(full), prefix="grad/")
    grads = build_gradients(nodes, loss_name, list(wrt), gb, infos, constants=constant_values(full))
    outputs = [helper.make_tensor_value_info(loss_name, infos[loss_name].elem_type, [])]
    for name in wrt:
        g = grads[name] or gb.zeros_like(name, infos[name].elem_type)
        d_name = gb.unique(f"d_{name}").removeprefix("grad/")
        gb.node("Identity", [g], [d_name])
        outputs.append(helper.make_tensor_value_info(d_name, infos[name].elem_type, infos[name].shape))
    # Like the training graphs, keep only what the outputs need (rules may emit gradients nothing reads).
    kept = prune_nodes([*nodes, *gb.nodes], [o.name for o in outputs])
    out_graph = helper.make_graph(kept, "gradients", list(graph.input), outputs,
                                  initializer=[*full.initializer, *gb.initializers])
    out = helper.make_model(out_graph, opset_imports=list(model.opset_import))
    out.ir_version = model.ir_version
    return out




def run_model(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], backend: str = "reference") -> list[np.ndarray]:
    return _session(model, backend)(feeds)


def _session(model: onnx.ModelProto, backend: str):
    """A function feeds -> outputs running ``model`` on ``backend`` (built once, run many times)."""
    if backend == "reference":
        from onnx.reference import ReferenceEvaluator

        from onnxtrain.runtime.backends.reference_ops import PATCHED_OPS, name_omitted_outputs

        evaluator = ReferenceEvaluator(name_omitted_outputs(model), new_ops=PATCHED_OPS)
        return lambda feeds: [np.asarray(v) for v in evaluator.run(None, dict(feeds))]
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return lambda feeds: sess.run(None, dict(feeds))


def check_gradients(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray], wrt: Sequence[str], *,
                    eps: float = 1e-6, rtol: float = 1e-4, atol: float = 1e-6, backend: str = "reference",
                    seed: int = 0, max_elements: int | None = None,
                    kink_tol: float | None = None) -> GradientReport:
    """Compare the analytic gradients of ``model`` w.r.t. ``wrt`` (graph inputs) with central differences.

    ``max_elements`` bounds the finite differences per input to that many randomly chosen elements (the
    others are NaN in ``report.numeric`` and not compared), which keeps big inputs cheap.

    With ``kink_tol``, an element where the two one-sided slopes differ by more than
    ``kink_tol * (1 + |central slope|)`` sits on a kink or a jump (ReLU at 0, a tie of Max, a value on a
    Clip bound): there is no derivative to compare, so it is skipped and counted in ``report.kinks``.
    """
    rng = np.random.default_rng(seed)
    forward = _session(model, backend)
    forward_outputs = forward(inputs)
    weights = {o.name: rng.standard_normal(np.shape(v)).astype(v.dtype)
               for o, v in zip(model.graph.output, forward_outputs) if np.issubdtype(v.dtype, np.floating)}
    gmodel = gradient_model(model, wrt, weights)
    results = run_model(gmodel, inputs, backend)
    report = GradientReport(weights=weights)

    def loss_at(feeds) -> float:
        outs = forward(feeds)
        return float(sum(np.sum(v.astype(np.float64) * weights[o.name])
                         for o, v in zip(model.graph.output, outs) if o.name in weights))

    base = loss_at(inputs) if kink_tol is not None else 0.0
    for name, analytic in zip(wrt, results[1:]):
        # a C-ordered copy: reshape(-1) of a strided view is a copy, whose perturbations the model would not see
        x = np.array(inputs[name], dtype=inputs[name].dtype, order="C")
        numeric = np.full(x.shape, np.nan, dtype=np.float64)
        flat = x.reshape(-1)
        picked = np.arange(flat.size)
        if max_elements is not None and flat.size > max_elements:
            picked = np.sort(rng.choice(flat.size, max_elements, replace=False))
        for i in picked:
            orig = flat[i]
            flat[i] = orig + eps
            hi = loss_at({**inputs, name: x})
            flat[i] = orig - eps
            lo = loss_at({**inputs, name: x})
            flat[i] = orig
            slope = (hi - lo) / (2 * eps)
            if kink_tol is not None and abs((hi - base) - (base - lo)) / eps > kink_tol * (1 + abs(slope)):
                report.kinks[name] = report.kinks.get(name, 0) + 1
                continue
            numeric.reshape(-1)[i] = slope
        compared = picked[~np.isnan(numeric.reshape(-1)[picked])]
        analytic = np.asarray(analytic, dtype=np.float64).reshape(x.shape)
        report.analytic[name], report.numeric[name] = analytic, numeric
        err = (np.abs(analytic - numeric) / (atol + rtol * np.abs(numeric))).reshape(-1)[compared]
        report.errors[name] = float(np.nan_to_num(err, nan=np.inf).max()) if err.size else 0.0
    return report
