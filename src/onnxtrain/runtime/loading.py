"""Reading artifacts and opening sessions on them, with errors that name the artifact."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping

import numpy as np
import onnx

from onnxtrain.errors import ArtifactError, first_line
from onnxtrain.runtime.backends import check_device, open_session

__all__ = ["load_model", "open_artifact_session", "check_connected"]

logger = logging.getLogger(__name__)


def _onnx_beside_ort(path: str, what: str) -> str:
    """The .onnx artifact for a .ort one: generate_artifacts(ort_format=True) writes both, and onnxtrain's runtime
    reads ONNX (it reads the metadata and passes the graphs through its own rewrites first)."""
    if not path.endswith(".ort") or not os.path.exists(path):
        return path
    onnx_path = path[:-len(".ort")] + ".onnx"
    if not os.path.exists(onnx_path):
        raise ArtifactError(f"the {what} {path!r} is in ORT format, which onnxtrain's Python runtime does not read; "
                            f"pass the .onnx artifact generate_artifacts wrote beside it ({onnx_path!r} is missing)")
    logger.info("%s %s: reading %s, the ONNX artifact written with it (the runtime reads ONNX)", what, path, onnx_path)
    return onnx_path


def load_model(uri: str | os.PathLike | bytes | onnx.ModelProto, what: str) -> onnx.ModelProto:
    """Read an artifact; a missing or unreadable file is a clear error (FileNotFoundError, ArtifactError)."""
    if isinstance(uri, onnx.ModelProto):
        return uri
    try:
        if isinstance(uri, bytes):
            return onnx.load_from_string(uri)
        path = _onnx_beside_ort(os.fspath(uri), what)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{what} not found: {path}")
        return onnx.load(path)
    except (FileNotFoundError, ArtifactError):
        raise
    except Exception as exc:  # protobuf and onnx raise several types for a file that is not a model
        raise ArtifactError(f"cannot read the {what} {uri!r}: it is not a valid ONNX model "
                            f"({first_line(exc)})") from None


def open_artifact_session(model: onnx.ModelProto, what: str, device: str, session_options,
                          constants: Mapping[str, np.ndarray] | None = None):
    """A session for an artifact (``constants``: as for ``open_session``); an engine that rejects the model gives an
    ArtifactError, not its traceback."""
    check_device(device)
    try:
        return open_session(model, device, session_options, constants=constants)
    except Exception as exc:  # onnxruntime raises its own exception types for invalid graphs
        raise ArtifactError(f"the {what} cannot be loaded: {first_line(exc)}{_missing_kernel_hint(model, exc)}") \
            from None


_NO_KERNEL = re.compile(r"Could not find an implementation for (\w+)\(\d+\) node with name '([^']*)'")


def _missing_kernel_hint(model: onnx.ModelProto, exc: BaseException) -> str:
    """For onnxruntime's "no implementation" error: the element types the node receives, which its build has
    no kernel for (a bfloat16 or float16 export on the CPU provider, typically), and what to do."""
    found = _NO_KERNEL.search(str(exc))
    if found is None:
        return ""
    op_type, name = found.groups()
    node = next((n for n in model.graph.node if n.name == name), None)
    if node is None:
        return ""
    try:  # the error path only: the artifacts keep few value infos, so infer the types here
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:
        return ""
    types = {v.name: v.type.tensor_type.elem_type for v in (*inferred.input, *inferred.value_info, *inferred.output)}
    types.update({t.name: t.data_type for t in inferred.initializer})
    read = [onnx.TensorProto.DataType.Name(types[i]).lower() if types.get(i) else "?" for i in node.input if i]
    if not any(t != "?" for t in read):
        return ""
    return (f" (node {name!r} reads {', '.join(read)}: this onnxruntime build has no {op_type} kernel for "
            f"those types; when the node is the exported model's own, that model does not run on it either: "
            f"export it in float32)")


def check_connected(model: onnx.ModelProto, what: str) -> None:
    """Every node reads only graph inputs, initializers and earlier nodes' outputs, and every graph output is
    computed: what a damaged file that still parses usually breaks, found without opening a session.

    The runtime never runs the ONNX checker (generate_artifacts did, with ``full_check``, and the runtime's passes
    are tested to keep it passing): its operator schemas cost 7.5 MB of resident memory on first use, 2.5 % of a
    LoRA step's peak on a 6-layer BERT. onnxruntime checks the rest when it opens the model.
    """
    graph = model.graph
    known = {""} | {v.name for v in graph.input} | {t.name for t in graph.initializer}
    known.update(t.values.name for t in graph.sparse_initializer)
    for node in graph.node:
        for name in node.input:
            if name not in known:
                raise ArtifactError(f"the {what} is not a valid ONNX model: node {node.name or node.op_type!r} reads "
                                    f"{name!r}, which no graph input, initializer or earlier node defines")
        known.update(node.output)
    for value in graph.output:
        if value.name not in known:
            raise ArtifactError(f"the {what} is not a valid ONNX model: its output {value.name!r} is not computed")
