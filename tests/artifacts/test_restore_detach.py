"""torch's detach() is a stop-gradient: exported by dynamo as an Identity recorded as aten.detach (its gradient
rule passes nothing), or, with the exporter's graph optimizer on (torch.onnx.export's default), removed, and then
put back from the other nodes' records (RestoreDetach). Both gave torch's gradient plus the detached branch's."""

from __future__ import annotations

import numpy as np
import pytest

from onnxtrain.artifacts import LossType, generate_artifacts
from tests.artifacts.torch_step import assert_step_matches_torch

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")  # the dynamo exporter's; it needs a newer onnx than onnxtrain's floor


class _SquareDetached(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        y = self.lin(x)
        return y + y.detach() ** 2


class _StraightThrough(torch.nn.Module):
    """Rounding with a straight-through gradient, as quantization-aware training writes it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.head = torch.nn.Linear(4, 6), torch.nn.Linear(6, 3)

    def forward(self, x):
        h = self.lin(x) * 3.0
        return self.head(h + (torch.round(h) - h).detach())


@pytest.mark.parametrize("optimize", [False, True])
@pytest.mark.parametrize("make", [_SquareDetached, _StraightThrough])
def test_gradients_stop_at_detach(tmp_path, make, optimize):
    model = make()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    target = rng.standard_normal((5, 3)).astype(np.float32)
    path = tmp_path / "model.onnx"
    torch.onnx.export(model, (torch.from_numpy(x),), str(path), dynamo=True, optimize=optimize,
                      input_names=["x"], output_names=["y"])
    generate_artifacts(str(path), loss=LossType.MSELoss, artifact_directory=tmp_path / "artifacts")
    assert_step_matches_torch(model, tmp_path / "artifacts", x, target, torch.nn.functional.mse_loss)
