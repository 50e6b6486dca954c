"""Export a zoo model, generate its artifacts, and check them against torch.

Each check raises (AssertionError or the library's own error) with a one-line message, so the tests and the
report (``python -m tests.zoo.report``) state failures the same way.
"""

from __future__ import annotations

import copy
import re
import time
import warnings
from pathlib import Path

import numpy as np
import onnx

from onnxtrain import blocks
from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, generate_artifacts
from tests.float64 import as_float64
from tests.zoo.models import Spec
from tests.zoo.vision import import_torchvision

EXPORTERS = ("torchscript-train", "torchscript-eval", "dynamo")
STEPS = 20
LR = 1e-3
GRAD_RTOL = 1e-4  # norm-wise, per parameter tensor, float32 (issue 12)
FLOAT64_RTOL = 1e-6  # the same, with the training graph run in float64


def one_line(exc: BaseException, limit: int = 400) -> str:
    """The first line of an error, as a user sees it."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip().splitlines()  # torch.export colours its messages
    line = f"{type(exc).__name__}: {text[0] if text else ''}"
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _torch():
    import torch

    return torch


def initial_model(spec: Spec):
    """The seeded torch model in eval mode, with distinct, non-trivial weights and calibrated BatchNorm.

    The TorchScript exporter merges initializers of equal value in eval mode (every fresh BatchNorm weight is
    ones), which would tie parameters torch keeps apart; small random perturbations keep them distinct.
    BatchNorm running statistics are set from one batch so eval-mode activations keep their scale.
    """
    torch = _torch()
    import_torchvision()  # timm and transformers import torchvision too
    torch.manual_seed(0)
    model = spec.build()
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):
                t.copy_(torch.rand_like(t) + 0.5)
            else:
                # the std of one value (Gemma's 0-d embedding scale, Swin2SR's (1, 1, 1, 1) image mean) is NaN:
                # those and 1-d tensors get unit noise
                t.add_(0.1 * torch.randn_like(t) * (1 if t.dim() <= 1 or t.numel() == 1 else
                                                    t.std().clamp(min=1e-2)))
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if norms:
        momenta = [m.momentum for m in norms]
        for m in norms:
            m.momentum = None  # cumulative average: running statistics = this batch's
        model.train()
        with torch.no_grad():
            model(*to_torch(spec.inputs(spec.batches[0], spec.sizes[0], np.random.default_rng(1))))
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
    return model.eval()


def to_torch(arrays, dtype=None):
    torch = _torch()
    out = []
    for a in arrays:
        t = torch.from_numpy(np.ascontiguousarray(a))
        out.append(t.to(dtype) if dtype is not None and t.is_floating_point() else t)
    return tuple(out)


def export(spec: Spec, exporter: str, model, path: Path, dynamic_size: bool = True) -> Path:
    """Write the ONNX export of ``model``: dynamic batch axis, and the spec's dynamic size axes unless
    ``dynamic_size`` is False."""
    torch = _torch()
    model = copy.deepcopy(model)  # a training-mode export runs the model, which moves BatchNorm statistics
    args = to_torch(spec.inputs(spec.batches[0], spec.sizes[0], np.random.default_rng(0)))
    in_axes = {0: "batch", **(spec.axes if dynamic_size else {})}
    out_axes = {0: "batch", **(spec.output_axes or {} if dynamic_size else {})}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter in ("dynamo", "dynamo-optimized"):
            dim = torch.export.Dim.DYNAMIC
            # optimize=False: the default rewrites fold eval-mode BatchNorm into the Conv weights, keeping
            # the Conv weight names, so the "parameters" would no longer be torch's. "dynamo-optimized" keeps
            # the default, which models without BatchNorm train through (artifacts/torch_names.py)
            torch.onnx.export(model.eval(), args, str(path), dynamo=True, external_data=False,
                              optimize=exporter == "dynamo-optimized",
                              input_names=["input"], output_names=["output"],
                              dynamic_shapes=({a: dim for a in in_axes},), verbose=False)
        else:
            training = exporter == "torchscript-train"
            mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
            torch.onnx.export(model.train(training), args, str(path), dynamo=False, opset_version=17,
                              do_constant_folding=False, training=mode, input_names=["input"],
                              output_names=["output"], dynamic_axes={"input": in_axes, "output": out_axes})
    return path


def check_standard(path: Path) -> None:
    """Only the default ONNX domain, and the full checker (with shape inference) passes."""
    model = onnx.load(str(path))
    domains = {o.domain for o in model.opset_import} - {"", "ai.onnx"}
    assert not domains, f"{path.name} imports opsets {sorted(domains)}"
    assert not model.functions, f"{path.name} has local functions {[f.name for f in model.functions][:3]}"

    def walk(graph):
        for node in graph.node:
            assert node.domain in ("", "ai.onnx"), f"{path.name}: node {node.name!r} ({node.op_type}) in domain " \
                                                   f"{node.domain!r}"
            for attr in node.attribute:
                for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    walk(g)

    walk(model.graph)
    onnx.checker.check_model(model, full_check=True)


class Run:
    """One (model, exporter): the torch model, its export and the generated artifacts."""

    def __init__(self, spec: Spec, exporter: str, folder: Path, model=None, dynamic_size: bool = True):
        self.spec, self.exporter = spec, exporter
        self.dynamic_size = dynamic_size and spec.sizes[1] is not None
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.model = model if model is not None else initial_model(spec)
        self.training = exporter == "torchscript-train"
        self.onnx_path = self.folder / f"{spec.name}.onnx"
        self.artifacts = self.folder / "artifacts"
        self.export_error = self.generate_error = None
        self.generate_seconds = None
        self._module = None
        self._deterministic = False
        try:
            export(spec, exporter, self.model, self.onnx_path, self.dynamic_size)
        except Exception as exc:  # noqa: BLE001 - recorded: the report names it, the tests fail with it
            self.export_error = one_line(exc)
            return
        try:
            start = time.perf_counter()
            generate_artifacts(str(self.onnx_path), loss=LossType.CrossEntropyLoss,
                               optimizer=blocks.AdamW(weight_decay=0.01, mode="torch"),
                               artifact_directory=self.artifacts, additional_output_names=["output"])
            self.generate_seconds = time.perf_counter() - start
        except Exception as exc:  # noqa: BLE001 - as above
            self.generate_error = one_line(exc)

    # -- what the checks share ---------------------------------------------------------------------------
    def require_artifacts(self) -> None:
        if self.export_error:
            raise RuntimeError(f"export failed: {self.export_error}")
        if self.generate_error:
            raise RuntimeError(f"generate_artifacts failed: {self.generate_error}")

    def batch(self, case: str, seed: int = 0):
        """(inputs, labels) for ``case``: base (first batch and size), batch (second batch), size (second size)."""
        spec = self.spec
        batch = spec.batches[1] if case == "batch" else spec.batches[0]
        size = spec.sizes[1] if case == "size" else spec.sizes[0]
        if size is None or (case == "size" and not self.dynamic_size):
            raise ValueError(f"{spec.name}: this export has a fixed input size")
        rng = np.random.default_rng(seed + {"base": 10, "batch": 20, "size": 30}[case])
        inputs = spec.inputs(batch, size, rng)
        return inputs, spec.labels(inputs, rng)

    def fresh_module(self, optimizer: bool = False):
        state = CheckpointState.load_checkpoint(self.artifacts / "checkpoint")
        module = Module(self.artifacts / "training_model.onnx", state, self.artifacts / "eval_model.onnx")
        opt = Optimizer(self.artifacts / "optimizer_model.onnx", module) if optimizer else None
        return state, module, opt

    def torch_model(self, dtype=None, training=None):
        model = copy.deepcopy(self.model)
        if dtype is not None:
            model = model.to(dtype)
        return model.train(self.training if training is None else training)


def check_artifacts(run: Run) -> None:
    """generate_artifacts succeeded, every artifact is standard ONNX, and none holds an initializer that no node
    reads (onnxruntime warns about each on every session)."""
    run.require_artifacts()
    for path in sorted(run.artifacts.glob("*.onnx")):
        check_standard(path)
        model = onnx.load(str(path))
        read = _values_read(model.graph) | {o.name for o in model.graph.output}
        unread = [i.name for i in model.graph.initializer if i.name not in read]
        assert not unread, f"{path.name}: initializers no node reads: {unread[:5]}"


def _values_read(graph) -> set[str]:
    """The names the nodes of ``graph`` and of its subgraphs read."""
    read = set()
    for node in graph.node:
        read.update(node.input)
        for attr in node.attribute:
            for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
                read |= _values_read(g)
    return read


def torch_loss_and_grads(run: Run, inputs, labels, dtype):
    torch = _torch()
    model = run.torch_model(dtype)
    out = model(*to_torch(inputs, dtype))
    loss = torch.nn.functional.cross_entropy(out, torch.from_numpy(labels))
    loss.backward()
    return float(loss.detach()), {n: (None if p.grad is None else p.grad.double().numpy())   # tied: every name
                         for n, p in model.named_parameters(remove_duplicate=False)}


def canonical_names(model) -> dict[str, str]:
    """Each parameter name -> the first name of the same tensor (torch ties GPT-2's embedding and head: the
    export may keep either name)."""
    first: dict[int, str] = {}
    return {n: first.setdefault(id(p), n) for n, p in model.named_parameters(remove_duplicate=False)}


def float64_gradients(run: Run, inputs, labels) -> dict[str, np.ndarray]:
    """The training graph's gradients computed in float64 (onnx.reference): what the graph computes without
    float32 rounding, to tell a wrong rule from an ill-conditioned float32 comparison."""
    from onnx.reference import ReferenceEvaluator

    from onnxtrain.conventions import LAZY_RESET_GRAD, grad_buffer_name, grad_output_name
    from onnxtrain.runtime.backends.reference_ops import PATCHED_OPS

    model = as_float64(onnx.load(str(run.artifacts / "training_model.onnx")))
    state = CheckpointState.load_checkpoint(run.artifacts / "checkpoint")
    widen = lambda a: a.astype(np.float64) if a.dtype == np.float32 else a  # noqa: E731
    values = {n: widen(p.data) for n, p in state.parameters}
    values.update({n: widen(np.asarray(b)) for n, b in state.buffers.items()})
    values.update({grad_buffer_name(n): np.zeros(p.data.shape) for n, p in state.parameters if p.requires_grad})
    values[LAZY_RESET_GRAD] = np.array(True)
    data = iter([*inputs, labels])
    feeds = {i.name: values[i.name] if i.name in values else widen(next(data)) for i in model.graph.input}
    outputs = dict(zip([o.name for o in model.graph.output],
                       ReferenceEvaluator(model, new_ops=PATCHED_OPS).run(None, feeds)))
    return {n: outputs[grad_output_name(n)] for n, p in state.parameters if p.requires_grad}


def check_deterministic(run: Run, inputs, labels, loss: float, grads: dict) -> None:
    """torch's float64 loss and gradients are the same on a second run: a model left random in training mode
    (a Dropout with p > 0) would make torch's float32 and float64 runs disagree, and the tolerance, which allows
    5x torch float32's own error, would then pass any gradient."""
    torch = _torch()
    again_loss, again = torch_loss_and_grads(run, inputs, labels, torch.float64)
    moved = [n for n, g in grads.items() if (g is None) != (again[n] is None) or
             g is not None and not np.allclose(g, again[n], rtol=1e-9, atol=1e-12)]
    assert abs(again_loss - loss) <= 1e-12 * max(1.0, abs(loss)) and not moved, (
        f"torch's own float64 runs differ (loss {loss:.6g}, then {again_loss:.6g}; gradients of {moved[:2]}): the "
        "model is random in training mode (dropout left on?), so no gradient can be compared")


def gradient_error(run: Run, case: str, seed: int, exact_check: bool = False) -> tuple[float, str]:
    """(worst error / tolerance, message) over every parameter for one batch; raises on a wrong loss or
    parameter set."""
    torch = _torch()
    if run._module is None:
        run._module = run.fresh_module()
    state, module, _ = run._module
    inputs, labels = run.batch(case, seed)
    module.train()
    module.lazy_reset_grad()
    loss = float(module(*inputs, labels)[0])
    ref_loss, ref64 = torch_loss_and_grads(run, inputs, labels, torch.float64)
    if not run._deterministic:
        check_deterministic(run, inputs, labels, ref_loss, ref64)
        run._deterministic = True
    loss32, ref32 = torch_loss_and_grads(run, inputs, labels, torch.float32)
    # as for the gradients: within 5x torch float32's own error where that is larger (training-mode BatchNorm over
    # a few values per channel: Inception-v3's last blocks at 96 px, torch float32 2e-3 off its float64 loss)
    tolerance = max(1e-4 * abs(ref_loss), 5 * abs(loss32 - ref_loss)) + 1e-6
    assert abs(loss - ref_loss) <= tolerance, f"loss {loss:.6g}, torch {ref_loss:.6g} (float32: {loss32:.6g}; {case})"
    canonical = canonical_names(run.model)
    used = {canonical[n] for n, g in ref64.items() if g is not None}
    ours = {n for n, p in state.parameters if p.requires_grad}
    scale = np.sqrt(sum(float(np.sum(g * g)) for g in ref64.values() if g is not None))
    names = sorted(ours & set(ref64))
    for name in names:
        if ref64[name] is None:  # unused by the forward pass: torch has no gradient, ours must be zero
            assert not np.any(state.parameters[name].grad), f"{name}: nonzero gradient for a parameter the loss " \
                                                            "does not use"
    names = [n for n in names if ref64[n] is not None]
    norms = {n: max(float(np.linalg.norm(ref64[n])), 1e-6 * scale) for n in names}  # zero in exact arithmetic
    errors = {n: float(np.linalg.norm(state.parameters[n].grad - ref64[n])) / norms[n] for n in names}
    torch_errors = {n: float(np.linalg.norm(ref32[n] - ref64[n])) / norms[n] for n in names}
    ratio, name = max(((errors[n] / max(GRAD_RTOL, 5 * torch_errors[n]), n) for n in names), default=(0.0, ""))
    message = (f"{name}: relative gradient error {errors.get(name, 0):.2e} (torch float32: "
               f"{torch_errors.get(name, 0):.2e})")
    if ratio >= 1 and exact_check:  # float32 disagrees: does the graph compute the exact gradient?
        exact = float64_gradients(run, inputs, labels)
        worst64 = max((float(np.linalg.norm(exact[n] - ref64[n])) / norms[n], n) for n in names)
        message += f"; in float64 the graph's worst error is {worst64[0]:.2e} ({worst64[1]})"
        if worst64[0] < FLOAT64_RTOL:
            ratio = 0.0
    if ratio < 1:  # the parameter sets are checked once the shared parameters' gradients are known to match
        trained = {canonical.get(n, n) for n in ours}
        assert trained >= used, (f"not trained: {sorted(used - trained)[:4]} (trainable: {len(ours)}, torch: "
                                 f"{len(used)})")
        assert ours <= set(ref64), (f"the other gradients match, but these non-parameters are trained: "
                                    f"{sorted(ours - set(ref64))[:4]}")
    return ratio, message


def check_gradients(run: Run, case: str, seeds: int = 3) -> None:
    """Loss and every parameter's gradient from the training artifacts match torch's (float64 reference).

    Norm-wise relative error below 1e-4 per tensor, or within 5x torch's own float32 error where that is larger
    (training-mode BatchNorm over few values is ill-conditioned: float32 torch is off too); the loss likewise.

    A ReLU or MaxPool input within float32 rounding of its kink (resnet18 at batch 3: one pre-activation of
    6.6e-7 out of 10^5) can take the other branch in onnxruntime than in torch, which changes that element's
    gradient by O(1) and a whole tensor's by 1e-2: such a batch says nothing about the rule. The check passes
    when the gradients match on one of ``seeds`` batches (the loss must match on every batch tried); a wrong
    rule fails on all of them.

    Deep networks (DenseNet-121, RegNet) can be that sensitive on every batch: float32 rounding in onnxruntime's
    kernels and in torch's flips different kinks. So when the last batch also disagrees in float32, the training
    graph is run in float64 (:func:`float64_gradients`, onnx.reference): if it then matches torch's float64
    gradients within 1e-6, the graph computes the exact gradient and the check passes; a wrong rule fails it.
    """
    run.require_artifacts()
    messages = []
    for seed in range(seeds):
        ratio, message = gradient_error(run, case, seed, exact_check=seed == seeds - 1)
        if ratio < 1:
            return
        messages.append(message)
    raise AssertionError(f"case {case}, {seeds} batches: " + "; ".join(messages))


def _expected_statistics(run: Run, before: dict[str, np.ndarray], inputs) -> dict[str, tuple[np.ndarray, ...]]:
    """Each BatchNorm running statistic after one training-mode forward from the exported values ``before``:
    name -> (torch's value, the ONNX definition's value).

    They differ in the variance: torch updates it with the unbiased batch variance, ONNX BatchNormalization
    (training_mode=1) with the biased one (a relative difference of momentum / (n - 1), n the values per
    channel). A training-mode TorchScript export traces the model in training mode, which moves its running
    statistics before they are written: hence the start from the exported values.
    """
    torch = _torch()
    reference = run.torch_model(torch.float32)
    buffers = dict(reference.named_buffers())
    biased = {}

    def hook(prefix):
        def record(module, args):
            x = args[0].detach().double()
            axes = [0, *range(2, x.dim())]
            biased[prefix] = (x.var(axes, unbiased=False).numpy(), module.momentum)
        return record

    norms = {n: m for n, m in reference.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)}
    for n, m in norms.items():
        m.register_forward_pre_hook(hook(n))
    with torch.no_grad():
        for n, value in before.items():
            if n in buffers:
                buffers[n].copy_(torch.from_numpy(value))
        reference(*to_torch(inputs))
    expected = {}
    for n in norms:
        var, momentum = biased[n]
        mean = buffers[f"{n}.running_mean"].numpy().copy()
        expected[f"{n}.running_mean"] = (mean, mean)
        onnx_var = (1 - momentum) * before.get(f"{n}.running_var", np.ones_like(var)) + momentum * var
        expected[f"{n}.running_var"] = (buffers[f"{n}.running_var"].numpy().copy(), onnx_var)
    return expected


def check_training(run: Run) -> list[float]:
    """20 AdamW steps lower the loss; a training-mode export's BatchNorm running statistics move after the first
    step as torch's do (the variance: as torch's or as ONNX BatchNormalization defines it, see
    _expected_statistics). Returns the step times (seconds)."""
    run.require_artifacts()
    state, module, opt = run.fresh_module(optimizer=True)
    opt.set_learning_rate(LR)
    inputs, labels = run.batch("base")
    before = {n: state.buffers[n] for n in state.buffers}
    losses, times = [], []
    for step in range(STEPS):
        start = time.perf_counter()
        losses.append(float(module(*inputs, labels)[0]))
        opt.step()
        module.lazy_reset_grad()
        times.append(time.perf_counter() - start)
        if step == 0 and run.training:
            expected = _expected_statistics(run, before, inputs)
            missing = sorted(set(expected) - set(before))
            assert not missing, f"running statistics not updated by the training graph: {missing[:3]}"
            for n, values in expected.items():
                # A BatchNorm after a linear map of a BatchNorm's output sees a batch mean that does not depend
                # on the data (W @ bias): its running mean stays put in torch too, and that is no failure.
                expected_move = max(float(np.max(np.abs(v - before[n]))) for v in values)
                if expected_move > 1e-6 * float(np.max(np.abs(before[n]))):
                    assert not np.array_equal(state.buffers[n], before[n]), f"{n} did not move"
                errs = [np.linalg.norm(state.buffers[n] - v) / np.linalg.norm(v) for v in values]
                assert min(errs) < 1e-4, f"{n}: relative difference {errs[0]:.2e} from torch's after one step"
    assert all(np.isfinite(losses)), f"non-finite losses {losses}"
    assert losses[-1] < losses[0], f"loss did not decrease in {STEPS} AdamW steps: {losses[0]:.4g} -> {losses[-1]:.4g}"
    return times


def check_exports(run: Run, folder: Path) -> None:
    """After two training steps, the eval model and the exported inference model give torch's eval outputs
    (with the same weights and statistics), at the base case and at a second batch size / input size."""
    run.require_artifacts()
    torch = _torch()
    import onnxruntime as ort

    state, module, opt = run.fresh_module(optimizer=True)
    inputs, labels = run.batch("base")
    for _ in range(2):
        module(*inputs, labels)
        opt.step()
        module.lazy_reset_grad()
    reference = run.torch_model(torch.float32, training=False)
    weights = {n: p.data for n, p in state.parameters}  # (name, Parameter) pairs, as the peer's API
    weights.update({n: state.buffers[n] for n in state.buffers})
    known = dict(reference.named_parameters(remove_duplicate=False)) | dict(reference.named_buffers())
    with torch.no_grad():
        for n, value in weights.items():
            assert n in known, f"checkpoint entry {n!r} is no torch parameter or buffer"
            known[n].copy_(torch.from_numpy(value))
    path = folder / "inference.onnx"
    module.export_model_for_inferencing(path, ["output"])
    check_standard(path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    module.eval()
    cases = ["base", "batch"] + (["size"] if run.dynamic_size else [])
    for case in cases:
        inputs, labels = run.batch(case, seed=1)
        with torch.no_grad():
            expected = reference(*to_torch(inputs)).numpy()
        eval_output = module(*inputs, labels)[1]
        inference_output = session.run(["output"], {"input": inputs[0]})[0]
        for what, got in (("eval model", eval_output), ("inference model", inference_output)):
            assert got.shape == expected.shape, f"{what}: shape {got.shape}, torch {expected.shape} ({case})"
            err = np.linalg.norm(got - expected) / np.linalg.norm(expected)
            assert err < 1e-4, f"{what}: relative difference {err:.2e} from torch's eval output ({case})"
