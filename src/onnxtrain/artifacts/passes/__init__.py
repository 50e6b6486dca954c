"""The generator's graph passes (see onnxtrain.ir.pass_infra for the contract every pass keeps)."""

from onnxtrain.artifacts.passes.backward_order import BackwardOrder
from onnxtrain.artifacts.passes.cast_like_to_cast import CastLikeToCast
from onnxtrain.artifacts.passes.drop_unread_indices import DropUnreadIndices
from onnxtrain.artifacts.passes.eval_mode import EvalMode
from onnxtrain.artifacts.passes.fold_index_constants import FoldIndexConstants
from onnxtrain.artifacts.passes.fold_output_identities import FoldOutputIdentities
from onnxtrain.artifacts.passes.gelu_backward import GeluBackward
from onnxtrain.artifacts.passes.inline_decided_ifs import InlineDecidedIfs
from onnxtrain.artifacts.passes.inline_functions import InlineLocalFunctions
from onnxtrain.artifacts.passes.pool_before_relu import PoolBeforeRelu
from onnxtrain.artifacts.passes.recompute import RecomputeInBackward
from onnxtrain.artifacts.passes.restore_detach import RestoreDetach
from onnxtrain.artifacts.passes.sequences_to_split import SequencesToSplit
from onnxtrain.artifacts.passes.shapes_in_forward import ShapesInForward
from onnxtrain.artifacts.passes.transposed_products import TransposedProducts

__all__ = ["EvalMode", "DropUnreadIndices", "PoolBeforeRelu", "FoldOutputIdentities", "SequencesToSplit",
           "RecomputeInBackward", "ShapesInForward", "GeluBackward", "BackwardOrder", "CastLikeToCast",
           "InlineLocalFunctions", "TransposedProducts", "FoldIndexConstants", "InlineDecidedIfs",
           "RestoreDetach"]
