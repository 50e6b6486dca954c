"""The element types a checkpoint can hold: numpy dtype name <-> safetensors dtype code.

bfloat16 is available when ``ml_dtypes`` is installed (it comes with onnx); every other type is plain numpy.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SUPPORTED_DTYPES", "SAFETENSORS_CODES", "dtype_from_name", "dtype_from_code", "supported_names"]

# numpy dtype name -> safetensors header code, in the order error messages list them.
SAFETENSORS_CODES: dict[str, str] = {
    "float32": "F32",
    "float64": "F64",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
}


def _load_dtypes() -> dict[str, np.dtype]:
    dtypes = {name: np.dtype(name) for name in SAFETENSORS_CODES if name != "bfloat16"}
    try:
        import ml_dtypes
    except ImportError:  # bfloat16 checkpoints then fail with "unsupported dtype", naming ml_dtypes
        return dtypes
    dtypes["bfloat16"] = np.dtype(ml_dtypes.bfloat16)
    return dtypes


# numpy dtype name -> native-byte-order numpy dtype, for the types this installation can hold.
SUPPORTED_DTYPES: dict[str, np.dtype] = _load_dtypes()
_NAME_OF_CODE = {code: name for name, code in SAFETENSORS_CODES.items() if name in SUPPORTED_DTYPES}


def supported_names() -> str:
    """The supported dtype names as one comma-separated string, for error messages."""
    names = ", ".join(SUPPORTED_DTYPES)
    return names if "bfloat16" in SUPPORTED_DTYPES else names + " (bfloat16 needs ml_dtypes)"


def dtype_from_name(name: str) -> np.dtype | None:
    """The numpy dtype called ``name`` ("float32", "bool", ...), or None if checkpoints cannot hold it."""
    return SUPPORTED_DTYPES.get(name) if isinstance(name, str) else None


def dtype_from_code(code: str) -> np.dtype | None:
    """The numpy dtype of the safetensors code ``code`` ("F32", "BOOL", ...), or None if unsupported."""
    name = _NAME_OF_CODE.get(code) if isinstance(code, str) else None
    return None if name is None else SUPPORTED_DTYPES[name]
