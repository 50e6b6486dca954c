"""The peer's onnxblock names and arguments (InputLike, PassThrough, SequenceConstruct, ReduceAllL2, LabelEncoder,
custom_op_library, base(model, model_path), Block(temp_file_name), infer_shapes_on_base), and blocks that read a
name the model does not define."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxtrain.onnxblock as onnxblock
from tests import models

B = onnxblock.blocks


def _run(model: onnx.ModelProto, feeds: dict, outputs: list[str]) -> list[np.ndarray]:
    """``outputs`` (any values of ``model``, made its graph outputs) run by onnxruntime."""
    model = onnx.shape_inference.infer_shapes(model)
    graph = model.graph
    typed = {v.name: v for v in [*graph.value_info, *graph.input, *graph.output]}
    typed.update((t.name, helper.make_tensor_value_info(t.name, t.data_type, t.dims)) for t in graph.initializer)
    del graph.output[:]
    graph.output.extend(typed[name] for name in outputs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(outputs, {i.name: feeds[i.name] for i in graph.input if i.name in feeds})


def _build(make, *, base=None):
    """(model, output name) of ``make()`` called inside ``onnxblock.base(base or models.mlp())``."""
    with onnxblock.base(base if base is not None else models.mlp()) as accessor:
        out = make()
        return accessor.model, out


def _with_input(name: str, elem_type: int, shape, opset: int | None = None) -> onnx.ModelProto:
    model = models.mlp()
    model.graph.input.append(helper.make_tensor_value_info(name, elem_type, shape))
    if opset is not None:
        model.opset_import[0].version = opset
    return model


@pytest.mark.parametrize("attrs, x", [
    (dict(keys_int64s=[10, 11, 12], values_int64s=[0, 1, 2]), np.array([12, 10, 7, 11, 10])),
    (dict(keys_int64s=[10, 11, 12], values_int64s=[0, 1, 2], default_int64=5), np.array([12, 99, 11])),
    (dict(keys_int64s=[3, 1], values_floats=[0.5, 1.5]), np.array([[1, 3], [2, 1]])),
    (dict(keys_floats=[0.5, 2.0], values_int64s=[7, 8]), np.array([2.0, 0.5, 1.0], np.float32)),
    (dict(keys_int64s=[1, 1, 2], values_int64s=[5, 6, 7]), np.array([1, 2])),   # repeated key: the first wins
    (dict(keys_strings=["cat", "dog"], values_int64s=[0, 1]), np.array(["dog", "cow", "cat"], dtype=object)),
    (dict(keys_int64s=[0, 1], values_strings=["no", "yes"]), np.array([1, 0, 4])),
])
def test_label_encoder_is_written_with_default_domain_ops_and_matches_the_ml_kernel(attrs, x):
    """The peer's LabelEncoder is an ai.onnx.ml node, which artifacts may not hold (and which detach_foreign_ops took
    out with the loss it fed): it is Equal against the keys, ArgMax, Gather and a Where for the default."""
    elem = helper.np_dtype_to_tensor_dtype(x.dtype) if x.dtype != object else TensorProto.STRING
    base = _with_input("raw", elem, list(x.shape), opset=19)
    model, out = _build(lambda: B.LabelEncoder(**attrs)("raw"), base=base)
    assert all(n.domain in ("", "ai.onnx") for n in model.graph.node)
    (got,) = _run(model, {"input": np.zeros((1, 8), np.float32), "raw": x}, [out])

    defaults = dict(default_float=0.0, default_int64=-1, default_string="_Unused")   # the peer's defaults
    node = helper.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml", **{**defaults, **attrs})
    value_kind = next(k for k in attrs if k.startswith("values_"))
    out_type = {"values_int64s": TensorProto.INT64, "values_floats": TensorProto.FLOAT,
                "values_strings": TensorProto.STRING}[value_kind]
    ml = helper.make_model(helper.make_graph([node], "ml", [helper.make_tensor_value_info("x", elem, None)],
                                             [helper.make_tensor_value_info("y", out_type, None)]),
                           opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid("ai.onnx.ml", 2)])
    (expected,) = _run(ml, {"x": x}, ["y"])
    assert got.shape == x.shape
    np.testing.assert_array_equal(got, expected)


def test_label_encoder_checks_its_arguments_and_string_keys_before_opset_19():
    with pytest.raises(ValueError, match="one of keys_floats, keys_int64s, keys_strings"):
        B.LabelEncoder(values_int64s=[1])
    with pytest.raises(ValueError, match="as many values as keys"):
        B.LabelEncoder(keys_int64s=[1, 2], values_int64s=[1])
    base = _with_input("raw", TensorProto.STRING, ["b"], opset=17)
    with pytest.raises(ValueError, match=r"Equal on strings, which ONNX has from opset 19, and the model is opset 17 "
                                         r".*map the string labels to integers before feeding them"):
        _build(lambda: B.LabelEncoder(keys_strings=["a"], values_int64s=[0])("raw"), base=base)


def test_a_block_reading_a_name_the_model_does_not_have_is_a_clear_error():
    """Neg()("outptu") returned "Neg_out" and left a model that fails the ONNX check; the peer raises there."""
    with pytest.raises(ValueError, match=r"block Neg reads 'outptu' .*not a value of the model.*did you mean "
                                         r"'output'\?.*The model's inputs are \['input'\], its outputs \['output'\]"):
        _build(lambda: B.Neg()("outptu"))


def test_a_loss_block_reading_a_misspelt_output_names_itself_and_the_value():
    """The innermost block that read the name, as the README says; a close match is offered."""
    with pytest.raises(ValueError, match=r"block CrossEntropyLoss: unknown value 'outptu'.*did you mean 'output'"):
        _build(lambda: onnxblock.loss.CrossEntropyLoss()("outptu"))


def test_an_undefined_label_encoder_input_is_an_error_not_a_crash():
    """ONNX's shape inference crashed the process (SIGSEGV) on an ai.onnx.ml LabelEncoder reading an undeclared
    input, the next block inferring types (CrossEntropyLoss): run apart so that a crash fails only this test."""
    script = textwrap.dedent("""
        import onnxtrain.onnxblock as onnxblock
        from tests import models

        class Loss(onnxblock.TrainingBlock):
            def __init__(self):
                super().__init__()
                self.ce = onnxblock.loss.CrossEntropyLoss()
                self.le = onnxblock.blocks.LabelEncoder(keys_int64s=[10, 11], values_int64s=[0, 1])

            def build(self, out):
                return self.ce(out, self.le("raw_labels"))

        try:
            with onnxblock.base(models.mlp()):
                Loss()("output")
        except ValueError as exc:
            print("ValueError:", exc)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ValueError: block LabelEncoder reads 'raw_labels'" in done.stdout
    assert "not a value of the model" in done.stdout


def test_reading_a_value_before_the_node_that_computes_it_is_refused():
    class Backwards(onnxblock.Block):
        def build(self, x):
            self.base.graph.node.append(helper.make_node("Neg", ["later"], ["early"]))
            self.base.graph.node.append(helper.make_node("Relu", [x], ["later"]))
            return "early"

    with pytest.raises(ValueError, match=r"block Backwards reads 'later' .*computed only by a later node"):
        _build(lambda: Backwards()("output"))


def test_peer_constructors_and_defaults():
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    y = _run(models.mlp(), {"input": x}, ["output"])[0]
    cases = [
        (lambda: B.Pow(exponent=2.0)("output"), y ** 2),
        (lambda: B.Clip(clip_min=-0.1, clip_max=0.2)("output"), np.clip(y, -0.1, 0.2)),
        (lambda: B.ReduceMean()("output"), y.mean(keepdims=True)),          # the peer keeps the axes: [1, 1]
        (lambda: B.ReduceSum()("output"), y.sum(keepdims=True)),
        (lambda: B.ReduceSum(keepdims=False)("output"), y.sum()),
        (lambda: B.Constant(value_float=0.5)(), np.array([0.5], np.float32)),   # float [1], as the peer's
        (lambda: B.ReduceAllL2()("output", "output"), np.sqrt(2 * (y ** 2).sum())),
    ]
    for make, expected in cases:
        model, out = _build(make)
        assert all(n.domain in ("", "ai.onnx") for n in model.graph.node)
        (got,) = _run(model, {"input": x}, [out])
        assert got.shape == np.shape(expected)
        np.testing.assert_allclose(got, expected, rtol=1e-5)
    label_encoder = B.LabelEncoder(keys_int64s=[1], values_floats=[2.0])
    assert (label_encoder.default.dtype, float(label_encoder.default)) == (np.float32, 0.0)
    assert int(B.LabelEncoder(keys_int64s=[1], values_int64s=[2]).default) == -1


def test_input_like_pass_through_and_sequence_construct():
    x = np.ones((2, 8), np.float32)

    def make():
        target = B.InputLike("output")("target")
        passed = B.PassThrough()("output", target)
        seq = B.SequenceConstruct()(*passed)
        return target, passed, seq

    model, (target, passed, seq) = _build(make)
    assert target == "target" and passed == ("output", "target")
    declared = next(i for i in model.graph.input if i.name == "target")
    assert declared.type == next(o for o in model.graph.output if o.name == "output").type
    (got,) = _run(model, {"input": x, "target": np.zeros((2, 4), np.float32)}, [seq])
    assert len(got) == 2 and got[1].shape == (2, 4)
    with pytest.raises(LookupError, match="Could not find input or output with name nope"):
        _build(lambda: B.InputLike("nope")())


def test_block_temp_file_name_infer_shapes_on_base_and_base_with_a_path(tmp_path):
    class Shapes(onnxblock.Block):
        def __init__(self):
            super().__init__(temp_file_name="scratch.onnx")

        def build(self, x):
            inferred = self.infer_shapes_on_base()
            return [v.name for v in inferred.graph.value_info]

    model, names = _build(lambda: Shapes()("output"))
    assert {"h", "a"} <= set(names)
    with pytest.raises(RuntimeError, match="relative path for the temp_file_name"):
        onnxblock.Block.__init__(Shapes(), temp_file_name=str(tmp_path / "x.onnx"))
    path = tmp_path / "model.onnx"
    onnx.save(models.mlp(), path)
    with onnxblock.base(onnx.load(path), str(path)) as accessor:
        assert accessor.has_path and accessor.path == str(path)
        B.Neg()("output")


def test_custom_op_library_is_refused_with_the_reason(tmp_path):
    with pytest.raises(RuntimeError, match="does not exist"):
        with onnxblock.custom_op_library(tmp_path / "missing.so"):
            pass
    library = tmp_path / "libcustom.so"
    library.write_bytes(b"")
    with pytest.raises(ValueError, match="not supported: onnxtrain artifacts use the default ONNX domain only"):
        with onnxblock.custom_op_library(library):
            pass
