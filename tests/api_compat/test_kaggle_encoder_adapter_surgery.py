"""A Kaggle build script for on-device personalization of a published visual-speech encoder: it replaces
``onnx.save_model`` and ``onnx.save`` process-wide (inline saves only, dropping the external-data keywords) before
importing the training package, drops the encoder's four diagnostic outputs, appends a trainable Linear adapter
(identity weight, zero bias) by graph surgery after ``features``, declares ``adapted_features`` as the only output,
saves the patched model and passes its path to generate_artifacts with ``requires_grad`` only (the encoder's
weights in neither list), an MSE loss on ``loss_input_names=["adapted_features"]`` and a nominal checkpoint.

Source: a public GitHub file found through the code index (stored file id 58827068557, Liperty's
``tools/kaggle_build_training_artifacts.py``: the build script it writes and runs, steps A to D).
Adapted: the import; no venv bootstrap, Hugging Face login, download or upload; the published AV-HuBERT encoder
ONNX is played by a small random-weight torch encoder (frames of 8x8 instead of 88x88, a feed-forward block for
the transformer) with the same input, the same five outputs and the same 768 features; the work directory is
parametrised; the script's imports inside it sorted (ruff); the process-wide patch is undone after the script.
The Android TrainingSession the artifacts ship to is played by the Python API: MSE steps against a target, the
exported inference model run in onnxruntime.
"""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain.api import CheckpointState, Module, Optimizer  # was: the Android TrainingSession

torch = pytest.importorskip("torch")


# -- the user's build script, steps A to D (WORK and the encoder path parametrised, otherwise unchanged) -----------
def build(WORK, encoder_onnx_path):
    ARTIFACT_DIR = os.path.join(WORK, "artifacts")
    os.makedirs(ARTIFACT_DIR, exist_ok=True)

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    _orig_save_model = onnx.save_model

    def _patched_save_model(proto, path, *args, **kwargs):
        kwargs["save_as_external_data"] = False
        for k in ("all_tensors_to_one_file", "location", "size_threshold", "convert_attribute"):
            kwargs.pop(k, None)
        return _orig_save_model(proto, path, *args, **kwargs)

    onnx.save_model = _patched_save_model
    onnx.save = _patched_save_model

    print("STEP A: Loading encoder ONNX ...")
    model = onnx.load(encoder_onnx_path, load_external_data=True)
    graph = model.graph

    for o in [o for o in graph.output if o.name != "features"]:
        graph.output.remove(o)
    print(f"  pruned outputs: {[o.name for o in graph.output]}")

    print("STEP B: Adding trainable Linear adapter ...")
    W_init = np.eye(768, dtype=np.float32)
    b_init = np.zeros(768, dtype=np.float32)
    graph.initializer.append(numpy_helper.from_array(W_init, name="adapter.W"))
    graph.initializer.append(numpy_helper.from_array(b_init, name="adapter.b"))

    matmul_node = helper.make_node(
        "MatMul", inputs=["features", "adapter.W"], outputs=["__adapter_matmul"],
        name="adapter_matmul",
    )
    add_node = helper.make_node(
        "Add", inputs=["__adapter_matmul", "adapter.b"], outputs=["adapted_features"],
        name="adapter_add",
    )
    graph.node.extend([matmul_node, add_node])

    old = [o for o in graph.output if o.name == "features"][0]
    new_out = helper.make_tensor_value_info(
        "adapted_features", TensorProto.FLOAT,
        [d.dim_param if d.HasField("dim_param") else d.dim_value
         for d in old.type.tensor_type.shape.dim],
    )
    graph.output.remove(old)
    graph.output.append(new_out)

    PATCHED_ONNX = os.path.join(WORK, "avhubert_with_trainable_adapter.onnx")
    if os.path.exists(PATCHED_ONNX):
        os.remove(PATCHED_ONNX)
    for f in os.listdir(WORK):
        if f.endswith(".data"):
            os.remove(os.path.join(WORK, f))

    print("STEP C: Saving patched ONNX inline ...")
    onnx.save(model, PATCHED_ONNX)
    print(f"  {os.path.getsize(PATCHED_ONNX) / 1e6:.1f} MB")

    from onnxtrain import artifacts  # was: from onnxruntime.training import artifacts
    print("STEP D: generate_artifacts ...")
    artifacts.generate_artifacts(
        PATCHED_ONNX,
        requires_grad=["adapter.W", "adapter.b"],
        loss=artifacts.LossType.MSELoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=ARTIFACT_DIR,
        nominal_checkpoint=True,
        loss_input_names=["adapted_features"],
    )
    for f in sorted(os.listdir(ARTIFACT_DIR)):
        p = os.path.join(ARTIFACT_DIR, f)
        if os.path.isfile(p):
            print(f"  {f}  ({os.path.getsize(p) / 1e6:.1f} MB)")
    return ARTIFACT_DIR, PATCHED_ONNX
# ------------------------------------------------------------------------------------------------------------------


class _Encoder(torch.nn.Module):
    """The published encoder's interface: video (B, 1, T, H, W) -> features (B, T, 768) and four diagnostics."""

    def __init__(self):
        super().__init__()
        self.audio = torch.nn.Linear(26, 32)
        self.video = torch.nn.Linear(64, 32)
        self.layer_norm = torch.nn.LayerNorm(64)
        self.proj = torch.nn.Linear(64, 768)
        self.encoder = torch.nn.Sequential(torch.nn.Linear(768, 256), torch.nn.GELU(), torch.nn.Linear(256, 768),
                                           torch.nn.LayerNorm(768))

    def forward(self, video):
        frames = video[:, 0].flatten(2)
        feat_a = self.audio(torch.zeros(frames.shape[0], frames.shape[1], 26))
        feat_v = self.video(frames)
        feats_ln = self.layer_norm(torch.cat([feat_a, feat_v], dim=2))
        feats_proj = self.proj(feats_ln)
        return self.encoder(feats_proj), feat_a, feat_v, feats_ln, feats_proj


@pytest.fixture
def restore_onnx_save():
    saved = onnx.save, onnx.save_model
    yield
    onnx.save, onnx.save_model = saved


def test_adapter_surgery_nominal_checkpoint_and_training(tmp_path, restore_onnx_save):
    torch.manual_seed(0)
    encoder = _Encoder().eval()
    encoder_path = str(tmp_path / "avhubert_base_vox_433h_visual_encoder.onnx")
    torch.onnx.export(encoder, (torch.randn(1, 1, 6, 8, 8),), encoder_path, input_names=["video"],
                      output_names=["features", "feat_a", "feat_v", "feats_ln", "feats_proj"],
                      dynamic_axes={"video": {0: "B", 2: "T"}, "features": {0: "B", 1: "T_out"}},
                      do_constant_folding=False, dynamo=False)
    artifact_dir, patched = build(str(tmp_path), encoder_path)
    assert sorted(os.listdir(artifact_dir)) == ["checkpoint", "eval_model.onnx", "nominal_checkpoint",
                                                "optimizer_model.onnx", "training_model.onnx"]

    # Only the adapter is in the checkpoints; the nominal one names it without its values (reading a parameter of
    # it, or iterating its parameters, raises "Please load the parameter states first" on the peer too).
    state = CheckpointState.load_checkpoint(os.path.join(artifact_dir, "checkpoint"))
    assert sorted(name for name, _ in state.parameters) == ["adapter.W", "adapter.b"]
    nominal = CheckpointState.load_checkpoint(os.path.join(artifact_dir, "nominal_checkpoint"))
    assert len(nominal.parameters) == 2 and "adapter.W" in nominal.parameters and "adapter.b" in nominal.parameters
    assert os.path.getsize(os.path.join(artifact_dir, "nominal_checkpoint")) < 768 * 4
    with pytest.raises(RuntimeError, match="Please load the parameter states first"):
        nominal.parameters["adapter.W"]

    module = Module(os.path.join(artifact_dir, "training_model.onnx"), state,
                    os.path.join(artifact_dir, "eval_model.onnx"))
    optimizer = Optimizer(os.path.join(artifact_dir, "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(1e-4)
    rng = np.random.default_rng(0)
    video = rng.standard_normal((2, 1, 5, 8, 8)).astype(np.float32)
    with torch.no_grad():
        features = encoder(torch.from_numpy(video))[0].numpy()
    target = (features * 0.5 + 0.1).astype(np.float32)

    # The identity adapter starts as a pass-through: the loss is the encoder's features against the target.
    module.eval()
    start = float(module(video, target))
    assert start == pytest.approx(float(np.mean((features - target) ** 2)), rel=1e-4)
    module.train()
    for _ in range(10):
        module(video, target)
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    assert float(module(video, target)) < start

    exported = str(tmp_path / "personalized.onnx")
    module.export_model_for_inferencing(exported, ["adapted_features"])
    session = ort.InferenceSession(exported, providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["video"]
    (adapted,) = session.run(["adapted_features"], {"video": video})
    weights = dict((name, p.data) for name, p in state.parameters)
    np.testing.assert_allclose(adapted, features @ weights["adapter.W"] + weights["adapter.b"], rtol=1e-4, atol=1e-4)
    # The patched source model (saved by the user's inline onnx.save) still runs as given.
    source = ort.InferenceSession(patched, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(source.run(None, {"video": video})[0], features, rtol=1e-4, atol=1e-4)
