"""onnxtrain: train ONNX models on the device with the stock onnxruntime.

Offline phase: :func:`onnxtrain.artifacts.generate_artifacts` turns a forward ONNX model into plain-ONNX
training, eval and optimizer graphs plus a checkpoint. Training phase: :mod:`onnxtrain.api` runs them with
the same API as ``onnxruntime.training.api``.
"""

__version__ = "0.1.0"
