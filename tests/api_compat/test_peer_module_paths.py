"""Scripts that import the peer's API submodules (``from onnxruntime.training.api.checkpoint_state import
CheckpointState``, as type annotations often do) migrate by the same one-word change as the rest."""

from __future__ import annotations

import importlib

import pytest

import onnxtrain.api as api

# the peer's onnxruntime/training/api/ modules and the public names each defines (1.19.2)
PEER_MODULES = {
    "checkpoint_state": ["CheckpointState", "Parameter", "Parameters", "Properties"],
    "module": ["Module"],
    "optimizer": ["Optimizer"],
    "lr_scheduler": ["LinearLRScheduler"],
}


@pytest.mark.parametrize("module", sorted(PEER_MODULES))
def test_peer_submodule_names_are_the_api_objects(module):
    loaded = importlib.import_module(f"onnxtrain.api.{module}")
    for name in PEER_MODULES[module]:
        obj = getattr(loaded, name)
        assert getattr(api, name, obj) is obj, f"onnxtrain.api.{module}.{name} is not onnxtrain.api.{name}"
        assert isinstance(obj, type), f"onnxtrain.api.{module}.{name} is not a class"
