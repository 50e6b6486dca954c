"""Crash-safe file writes for every artifact (one implementation, shared with the checkpoint writer)."""

from onnxtrain.checkpoint.atomic import atomic_write as atomic_write_bytes

__all__ = ["atomic_write_bytes", "PROTO_LIMIT"]

# Protobuf cannot serialize a message of 2 GB or more, and onnx's checker takes a model in memory only below it.
PROTO_LIMIT = 1 << 31
