"""Fixtures for the Flower adapter: the demo artifacts, written once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def mlp_artifacts(tmp_path_factory):
    """Artifacts of the demo MLP 64-32-10, every parameter trainable."""
    from onnxtrain.federated.example import build_artifacts

    directory = tmp_path_factory.mktemp("mlp")
    build_artifacts(directory)
    return directory


@pytest.fixture(scope="session")
def frozen_artifacts(tmp_path_factory):
    """Artifacts of the demo MLP with the first layer frozen: only fc2 travels."""
    from onnxtrain.federated.example import build_artifacts

    directory = tmp_path_factory.mktemp("mlp_frozen")
    build_artifacts(directory, frozen=("fc1.weight", "fc1.bias"))
    return directory
