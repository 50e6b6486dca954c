"""The runtime's memory model (docs/memory.md), by exact byte accounting on a small model.

Per trainable float32 parameter of a small model (its update runs whole, double-buffered, fused with the
training graph) the runtime's own arrays hold 7 copies with AdamW (parameter and both moments double-buffered,
one gradient), 5 with SGD and momentum, 3 with plain SGD; per frozen parameter one. Larger models update in
place (4, 3 and 2 copies): tests/runtime/test_in_place.py. No
session holds a trainable parameter: every graph (training, eval, optimizer, and the training graph fused with
the optimizer) reads them as bound inputs, so the sessions' initializers are the graphs' constants only, the
same whatever the model's size. (Frozen weights that only convolutions and BatchNormalizations read are the
training sessions' constants: tests/runtime/test_frozen_constants.py.)
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxtrain import blocks
from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.artifacts import LossType, generate_artifacts
from onnxtrain.conventions import OptimizerMeta, TrainingMeta
from onnxtrain.runtime.loading import load_model
from onnxtrain.runtime.passes import ChunkUpdate, FusedNames, FuseOptimizer, chunk_bounds
from tests import models

# Copies of each trainable parameter in the runtime's arrays (parameters + gradients + optimizer states).
COPIES = {"adamw": 7, "sgd": 3, "sgd_momentum": 5}
OPTIMIZERS = {"adamw": blocks.AdamW, "sgd": blocks.SGD, "sgd_momentum": lambda: blocks.SGD(momentum=0.9)}


def _train(folder, model, optimizer: str, fuse: bool, frozen=()):
    generate_artifacts(model, requires_grad=None, frozen_params=list(frozen), loss=LossType.CrossEntropyLoss,
                       optimizer=OPTIMIZERS[optimizer](), artifact_directory=folder)
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state, folder / "eval_model.onnx")
    opt = Optimizer(folder / "optimizer_model.onnx", module)
    module.training_run.fuse = fuse
    rng = np.random.default_rng(0)
    for _ in range(3):
        module(rng.standard_normal((5, 8)).astype(np.float32), rng.integers(0, 4, 5).astype(np.int64))
        opt.step()
        module.lazy_reset_grad()
    return state


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "separate"])
@pytest.mark.parametrize("optimizer", sorted(COPIES))
def test_bytes_per_trainable_and_frozen_parameter(tmp_path, optimizer, fuse):
    state = _train(tmp_path, models.mlp(), optimizer, fuse, frozen=["fc1.weight"])
    values = state.values
    trainable, frozen = values.parameter_count(), values.parameter_count(False) - values.parameter_count()
    assert (trainable, frozen) == (16 + 4 * 16 + 4, 16 * 8)
    memory = values.memory()
    assert memory["params"] + memory["grads"] + memory["optimizer_states"] == COPIES[optimizer] * 4 * trainable
    assert memory["frozen"] == 4 * frozen
    assert memory["buffers"] == 0
    assert values.grads.spare is values.grads.current  # the gradients are updated in place


def _session_models(folder):
    train = load_model(folder / "training_model.onnx", "training model")
    optimizer = load_model(folder / "optimizer_model.onnx", "optimizer model")
    fused = FuseOptimizer(optimizer, TrainingMeta.from_model(train).trainable)(train).model
    return {"training": train, "eval": load_model(folder / "eval_model.onnx", "eval model"),
            "optimizer": optimizer, "fused": fused}


def test_no_session_holds_a_parameter(tmp_path):
    """The sessions' initializers do not grow with the parameters: they are the graphs' constants."""
    initializer_bytes = {}
    for hidden in (16, 256):
        folder = tmp_path / str(hidden)
        _train(folder, models.mlp(hidden=hidden), "adamw", fuse=True)
        params = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
        for kind, model in _session_models(folder).items():
            assert not params & {i.name for i in model.graph.initializer}, kind
            initializer_bytes[hidden, kind] = sum(np.prod(i.dims, dtype=np.int64) for i in model.graph.initializer)
    for kind in ("training", "eval", "optimizer", "fused"):
        assert initializer_bytes[16, kind] == initializer_bytes[256, kind], kind


def _largest_values(model, prefix=""):
    """Element counts of the values ``model`` computes (shape inference), by name."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph
    sizes = {}
    for vi in [*inferred.value_info, *inferred.output]:
        dims = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
        if vi.name.startswith(prefix) and None not in dims:
            sizes[vi.name] = int(np.prod(dims, dtype=np.int64))
    return sizes


def test_the_update_holds_a_chunk_not_a_vector_per_temporary(tmp_path):
    """Split into chunks, the optimizer graph's temporaries are a chunk each (docs/memory.md: the AdamW graph
    over whole vectors kept two vectors of temporaries alive), and the fused graph never builds the flat
    gradient vector: each chunk's gradient is written straight into its slice."""
    generate_artifacts(models.mlp(hidden=256), requires_grad=None, loss=LossType.CrossEntropyLoss,
                       optimizer=blocks.AdamW(max_norm=1.0), artifact_directory=tmp_path)
    models_ = _session_models(tmp_path)
    train, optimizer = models_["training"], models_["optimizer"]
    layout = OptimizerMeta.from_model(optimizer).layout
    sizes = [int(np.prod(shape)) for _, shape in layout]
    total, chunk = sum(sizes), 512
    bounds = chunk_bounds(sizes, chunk)
    assert len(bounds) >= total // chunk
    whole = _largest_values(optimizer)
    assert max(whole.values()) == total  # over whole vectors every temporary is a vector
    chunked = ChunkUpdate(bounds)(optimizer).model
    assert 0 < max(_largest_values(chunked).values()) <= chunk
    fused = FuseOptimizer(chunked, TrainingMeta.from_model(train).trainable, bounds, sizes)(train).model
    prefix = FusedNames.of_fused(fused).prefix
    assert 0 < max(_largest_values(fused, prefix).values()) <= chunk
    assert total not in _largest_values(fused).values()


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/status"), reason="reads Linux's /proc/self/status")
def test_loading_a_checkpoint_never_holds_its_parameters_twice(tmp_path):
    """The arrays read from the file go one by one into the flat parameter vector: at most one of them is resident
    beside it (before, every array was, until the state was built: a second copy of the model while loading).
    Measured as the resident peak (VmHWM) of a fresh process; untouched zeros (the gradients) are not resident."""
    import subprocess
    import sys

    from onnxtrain.checkpoint import CheckpointData, save_checkpoint

    count, mib = 8, 16  # eight tensors of 16 MiB
    rng = np.random.default_rng(0)
    trainable = {f"w{k}": rng.normal(size=(mib << 18,)).astype(np.float32) for k in range(count)}
    save_checkpoint(CheckpointData(trainable=trainable), tmp_path / "ckpt")
    script = (
        "import sys\nfrom onnxtrain.api import CheckpointState\n"
        "def status():\n    return {l.split(':')[0]: int(l.split()[1]) >> 10 for l in open('/proc/self/status')"
        " if l.startswith(('VmRSS', 'VmHWM'))}\n"
        "before = status()['VmRSS']\nstate = CheckpointState.load_checkpoint(sys.argv[1])\nafter = status()\n"
        "print(after['VmHWM'] - before, after['VmRSS'] - before)\n")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "ckpt")], capture_output=True, text=True,
                         check=True).stdout.split()
    peak, resident = int(out[0]), int(out[1])
    assert resident >= count * mib - 2   # the parameters
    assert peak - resident < 2 * mib, f"loading peaked {peak - resident} MiB above the {resident} MiB it keeps"


def test_a_resumed_optimizer_state_is_not_kept_beside_its_vectors(tmp_path):
    """The moments read from a checkpoint go into the optimizer's flat vectors; the arrays read are then let go
    (they stayed referenced for the whole run: two more copies of the parameters for a resumed AdamW)."""
    import gc
    import weakref

    from onnxtrain.checkpoint import load_checkpoint

    generate_artifacts(models.mlp(), requires_grad=None, loss=LossType.CrossEntropyLoss,
                       optimizer=blocks.AdamW(), artifact_directory=tmp_path)
    x, y = np.ones((4, 8), np.float32), np.array([0, 1, 2, 3])
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx")
    optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
    module(x, y)
    optimizer.step()
    CheckpointState.save_checkpoint(state, tmp_path / "resume.ckpt", include_optimizer_state=True)

    data = load_checkpoint(tmp_path / "resume.ckpt")
    saved = [weakref.ref(a) for states in data.optimizer.values() for a in states.values()]
    moment = next(iter(data.optimizer.values()))["exp_avg"].copy()
    resumed = CheckpointState(data)
    del data
    module = Module(tmp_path / "training_model.onnx", resumed, tmp_path / "eval_model.onnx")
    optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
    gc.collect()
    assert saved and all(ref() is None for ref in saved)
    assert np.array_equal(resumed.values.optimizer_states(("exp_avg", "exp_avg_sq"))["exp_avg"].current[:moment.size],
                          moment.reshape(-1))
    module(x, y)
    optimizer.step()   # trains on from the resumed moments
