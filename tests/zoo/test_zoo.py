"""The model zoo (issue 12): real architectures exported by torch train with onnxtrain as torch does.

Per model and exporter: the artifacts are standard ONNX; loss and gradients match torch at the exported size,
at a second batch size and (where the model allows) a second input size, all with the same artifacts; 20
AdamW steps lower the loss and move training-mode BatchNorm statistics as torch does; the eval and exported
inference models give torch's eval outputs. resnet18 (training-mode TorchScript export) and BERT (TorchScript,
both modes) run by default, the rest with ``-m slow``.
"""

from __future__ import annotations

import pytest

from tests.zoo.expected_failures import EXPECTED_FAILURES
from tests.zoo.harness import EXPORTERS, check_artifacts, check_exports, check_gradients, check_training
from tests.zoo.models import ZOO


def _params(checks):
    """One pytest param per (model, exporter, check): quick models by default, the rest slow; known
    failures (expected_failures.py) as strict xfails."""
    for name, spec in ZOO.items():
        for exporter in EXPORTERS:
            if exporter in spec.skip:
                continue
            for check in checks:
                if check == "size" and spec.sizes[1] is None:
                    continue
                marks = [] if exporter in spec.quick else [pytest.mark.slow]
                reason = EXPECTED_FAILURES.get((name, exporter, check)) or EXPECTED_FAILURES.get((name, exporter))
                if reason:
                    marks.append(pytest.mark.xfail(reason=reason, strict=True))
                yield pytest.param(name, exporter, check, marks=marks, id=f"{name}-{exporter}-{check}")


@pytest.mark.parametrize("name,exporter,check", _params(["generates"]))
def test_generates_standard_onnx(zoo_run, name, exporter, check):
    check_artifacts(zoo_run(name, exporter))


@pytest.mark.parametrize("name,exporter,check", _params(["base", "batch", "size"]))
def test_gradients_match_torch(zoo_run, name, exporter, check):
    check_gradients(zoo_run(name, exporter), check)


@pytest.mark.parametrize("name,exporter,check", _params(["trains"]))
def test_adamw_lowers_the_loss(zoo_run, name, exporter, check):
    check_training(zoo_run(name, exporter))


@pytest.mark.parametrize("name,exporter,check", _params(["exports"]))
def test_eval_and_inference_models_match_torch(zoo_run, name, exporter, check, tmp_path):
    check_exports(zoo_run(name, exporter), tmp_path)
