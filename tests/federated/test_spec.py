"""ParamSpec: what travels, and which updates are refused (plain numpy, no Flower needed)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from onnxtrain.api import CheckpointState
from onnxtrain.federated.example import dirichlet_split, load_digits, load_partition, test_set
from onnxtrain.federated.spec import ParamSpec, UpdateRejected


def _good(spec: ParamSpec) -> dict[str, np.ndarray]:
    return {n: np.zeros(s, d) for n, s, d in zip(spec.names, spec.shapes, spec.dtypes)}


def test_spec_lists_trainable_parameters_in_checkpoint_order(mlp_artifacts, frozen_artifacts):
    spec = ParamSpec.from_checkpoint(mlp_artifacts / "checkpoint")
    assert spec.names == ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
    assert spec.shapes == ((64, 32), (32,), (32, 10), (10,))
    frozen = ParamSpec.from_checkpoint(frozen_artifacts / "checkpoint")
    assert frozen.names == ("fc2.weight", "fc2.bias")   # the frozen first layer never travels


def test_check_accepts_a_matching_update_and_returns_spec_order(mlp_artifacts):
    spec = ParamSpec.from_checkpoint(mlp_artifacts / "checkpoint")
    shuffled = dict(reversed(list(_good(spec).items())))
    assert list(spec.check(shuffled)) == list(spec.names)


@pytest.mark.parametrize("corrupt, reason", [
    (lambda a: a.pop("fc2.bias"), r"missing \['fc2.bias'\]"),
    (lambda a: a.update(extra=np.zeros(3, np.float32)), r"unexpected \['extra'\]"),
    (lambda a: a.update({"fc1.weight": np.zeros((63, 32), np.float32)}), r"'fc1.weight' has shape \[63, 32\], "
                                                                          r"expected \[64, 32\]"),
    (lambda a: a.update({"fc1.bias": np.zeros(32, np.float64)}), r"'fc1.bias' has dtype float64, expected float32"),
    (lambda a: a["fc2.weight"].__setitem__((0, 0), np.nan), r"'fc2.weight' has 1 non-finite"),
    (lambda a: a["fc2.bias"].__setitem__(3, -np.inf), r"'fc2.bias' has 1 non-finite"),
])
def test_check_rejects_with_the_reason(mlp_artifacts, corrupt, reason):
    spec = ParamSpec.from_checkpoint(mlp_artifacts / "checkpoint")
    arrays = _good(spec)
    corrupt(arrays)
    with pytest.raises(UpdateRejected, match=reason):
        spec.check(arrays)


def test_load_into_leaves_the_state_untouched_on_a_bad_update(mlp_artifacts):
    state = CheckpointState.load_checkpoint(mlp_artifacts / "checkpoint")
    spec = ParamSpec.from_state(state)
    before = spec.values(state)
    arrays = {n: v + 1 for n, v in before.items()}
    arrays["fc2.bias"][0] = np.nan
    with pytest.raises(UpdateRejected):
        spec.load_into(state, arrays)
    for name, value in spec.values(state).items():
        np.testing.assert_array_equal(value, before[name])


def test_digits_split_is_non_iid_disjoint_and_excludes_the_test_set():
    x, y = load_digits()
    parts = [load_partition(i, 3) for i in range(3)]
    x_test, _ = test_set()
    rows = {r.tobytes() for p in parts for a in (p[0], p[2]) for r in a}
    assert sum(len(p[0]) + len(p[2]) for p in parts) == len(rows)          # disjoint (the digits have no dupes)
    assert not rows & {r.tobytes() for r in x_test}
    assert len(rows) + len(x_test) == len(x)
    histograms = np.stack([np.bincount(p[1], minlength=10) / len(p[1]) for p in parts])
    assert np.abs(histograms - histograms.mean(0)).max() > 0.1              # label-skewed
    assert [len(s) for s in dirichlet_split(y, 5, seed=1)] == [len(s) for s in dirichlet_split(y, 5, seed=1)]


def test_importing_onnxtrain_does_not_import_flower():
    code = ("import sys, onnxtrain, onnxtrain.api, onnxtrain.federated, onnxtrain.federated.cli, "
            "onnxtrain.federated.spec; print(any(m == 'flwr' or m.startswith('flwr.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_global_arrays_of_another_float_precision_are_cast_on_load(mlp_artifacts):
    """Flower's FedAdam returns float64 averages of float32 parameters; the client must take them."""
    state = CheckpointState.load_checkpoint(mlp_artifacts / "checkpoint")
    spec = ParamSpec.from_state(state)
    wide = {n: (v + 1).astype(np.float64) for n, v in spec.values(state).items()}
    with pytest.raises(UpdateRejected, match="dtype float64, expected float32"):
        spec.check(wide)                                # a reply to the server stays strict
    spec.load_into(state, wide)
    for name, value in spec.values(state).items():
        assert value.dtype == np.float32
        np.testing.assert_array_equal(value, wide[name].astype(np.float32))
    wide["fc2.bias"][0] = 1e300                         # not representable in float32: refused, not inf
    with pytest.raises(UpdateRejected, match="'fc2.bias' has 1 non-finite"):
        spec.load_into(state, wide)


def test_the_package_exports_the_simulate_function_not_a_module():
    """``from onnxtrain.federated import simulate`` (docs/federated.md) gave the submodule of the same name."""
    pytest.importorskip("flwr")
    code = ("from onnxtrain.federated import simulate, make_server_app; import onnxtrain.federated as f; "
            "print(callable(simulate), callable(f.simulate), callable(make_server_app))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["True", "True", "True"]
