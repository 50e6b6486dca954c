"""Crash-safe file writes for every artifact (one implementation, shared with the checkpoint writer)."""

from onnxtrain.checkpoint.atomic import atomic_write as atomic_write_bytes

__all__ = ["atomic_write_bytes"]
