"""A DragGAN port to onnxruntime-training: the latent vector of a StyleGAN generator is the trainable parameter
(its first 6 rows; the other 12 are a frozen parameter), the loss is computed inside the model, and each new seed
resets the latents through ``get_contiguous_parameters`` / ``copy_buffer_to_parameters`` and the private
``model._state`` (the peer's Module keeps its CheckpointState there).

Source: a public GitHub script found through the code index (stored file id 12929861073: ``import
onnxruntime.training.api as orttraining``, functions ``update_model`` and ``optimize``).
Adapted: the import; a tiny random-weight generator (a Linear over the 18 latent rows) instead of the StyleGAN2
checkpoint and its mapper session; the artifacts generated here with ``loss=None`` (the model's first output is
its loss, the image and features follow); ``device="cpu"`` instead of ``"cuda"``; 3 iterations instead of 100,
no image files, no point tracking (the handle points stay put), no video.
"""

import copy

import numpy as np
import onnx
import pytest

import onnxtrain.api as orttraining  # was: import onnxruntime.training.api as orttraining
from onnxtrain import artifacts  # was: from onnxruntime.training import artifacts

torch = pytest.importorskip("torch")


class _Generator(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.latent_trainable = torch.nn.Parameter(torch.randn(1, 6, 8))
        self.latent_untrainable = torch.nn.Parameter(torch.randn(1, 12, 8))
        self.proj = torch.nn.Linear(8, 16)

    def forward(self, handle_points, target_points):
        feat = self.proj(torch.cat([self.latent_trainable, self.latent_untrainable], 1))
        img = torch.tanh(feat).reshape(1, 1, 18, 16)
        features = feat.reshape(1, 2, 9, 16)
        loss = (img.mean() - (target_points - handle_points).mean()) ** 2 + features.abs().mean()
        return loss, img, features


# -- the user's code (unchanged) ----------------------------------------------------------------------------------
def update_model(model, model_snapshot, latent):
    model.copy_buffer_to_parameters(model_snapshot, trainable_only=True)
    model._state.parameters["latent_trainable"].data = latent[:, :6, :]
    model._state.parameters["latent_untrainable"].data = latent[:, 6:, :]


def optimize(model, optimizer, handles, targets, n_iter=3):
    step_size = 0.002
    user_constraints = np.array(
        [[1.0, handles[0][0], handles[0][1], targets[0][0], targets[0][1]]])
    handle_points = [(p[1].item(), p[2].item()) for p in user_constraints]
    target_points = [(p[3].item(), p[4].item()) for p in user_constraints]
    handle_points = np.fliplr(np.array(handle_points, dtype=np.float32))
    target_points = np.fliplr(np.array(target_points, dtype=np.float32))

    model.eval()
    loss, img, F0 = model(handle_points, target_points)
    losses = [loss.item()]

    model.train()
    optimizer.set_learning_rate(step_size)
    for _ in range(n_iter):
        model.lazy_reset_grad()
        loss, img, F = model(handle_points, target_points)
        optimizer.step()
        losses.append(loss.item())
    return losses, handle_points, target_points
# ------------------------------------------------------------------------------------------------------------------


def test_draggan_latent_optimization(tmp_path):
    torch.manual_seed(0)
    generator = _Generator()
    torch.onnx.export(generator, (torch.randn(1, 2), torch.randn(1, 2)), str(tmp_path / "g.onnx"),
                      input_names=["handle_points", "target_points"], output_names=["loss", "img", "F"],
                      dynamo=False, do_constant_folding=False)
    forward = onnx.load(str(tmp_path / "g.onnx"))
    artifacts.generate_artifacts(forward, requires_grad=["latent_trainable"],
                                 frozen_params=[i.name for i in forward.graph.initializer
                                                if i.name != "latent_trainable"],
                                 loss=None, optimizer=artifacts.OptimType.AdamW, artifact_directory=tmp_path)

    checkpoint_state = orttraining.CheckpointState.load_checkpoint(f"{tmp_path}/checkpoint")
    model = orttraining.Module(f"{tmp_path}/training_model.onnx", checkpoint_state,
                               f"{tmp_path}/eval_model.onnx", device="cpu")
    optimizer = orttraining.Optimizer(f"{tmp_path}/optimizer_model.onnx", model)
    assert model._state is checkpoint_state
    model_snapshot = model.get_contiguous_parameters(trainable_only=True)

    handles, targets = [(3.0, 4.0)], [(5.0, 7.0)]
    for seed in (71, 85):
        ws = np.tile(np.random.RandomState(seed).randn(1, 8).astype(np.float32), 18).reshape([1, 18, -1])
        update_model(model, model_snapshot, ws)
        np.testing.assert_array_equal(checkpoint_state.parameters["latent_untrainable"].data, ws[:, 6:])
        losses, handle_points, target_points = optimize(model, optimizer, handles, targets)

        # The eval loss is the generator's at the new latents, computed by torch.
        reference = copy.deepcopy(generator)
        with torch.no_grad():
            reference.latent_trainable.copy_(torch.from_numpy(ws[:, :6].copy()))
            reference.latent_untrainable.copy_(torch.from_numpy(ws[:, 6:].copy()))
            expected = reference(torch.from_numpy(handle_points.copy()), torch.from_numpy(target_points.copy()))[0]
        assert losses[0] == pytest.approx(expected.item(), rel=1e-5)
        assert losses[1] == pytest.approx(losses[0], rel=1e-6)  # the first training call, before any step
        assert losses[-1] < losses[1]  # AdamW moves the trainable latents downhill
        # Only the trainable rows moved; the frozen ones and the generator's weights did not.
        np.testing.assert_array_equal(checkpoint_state.parameters["latent_untrainable"].data, ws[:, 6:])
        assert not np.array_equal(checkpoint_state.parameters["latent_trainable"].data, ws[:, :6])
        np.testing.assert_array_equal(checkpoint_state.parameters["proj.weight"].data,
                                      generator.proj.weight.detach().numpy())
