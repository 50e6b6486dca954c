"""The runtime's graph passes: the training graph specialised for the reset flag, fused with the optimizer graph,
and with its frozen convolution weights as constants; the optimizer graph split into chunks and made safe to run
in place, or updated during the backward (see onnxtrain.ir.pass_infra for the contract every pass keeps)."""

from onnxtrain.runtime.passes.chunk_update import ChunkUpdate, chunk_bounds, chunk_name, chunk_slots
from onnxtrain.runtime.passes.frozen_constants import FrozenAsConstants, constant_names
from onnxtrain.runtime.passes.fuse_optimizer import FusedNames, FuseOptimizer
from onnxtrain.runtime.passes.in_place import InPlaceUpdate
from onnxtrain.runtime.passes.scatter_gradient import ScatterIntoGradient, zeroed_before_run
from onnxtrain.runtime.passes.specialize_reset import SpecializeReset
from onnxtrain.runtime.passes.update_in_backward import UpdateInBackward, finite_name

__all__ = ["SpecializeReset", "FuseOptimizer", "FusedNames", "ChunkUpdate", "chunk_bounds", "chunk_name", "chunk_slots",
           "InPlaceUpdate", "ScatterIntoGradient", "zeroed_before_run", "FrozenAsConstants",
           "constant_names", "UpdateInBackward", "finite_name"]
