"""Checks of the API's plain arguments, shared by the runtime's public classes."""

from __future__ import annotations

import numpy as np

__all__ = ["flag", "sequence_hint"]


def flag(value: object, name: str, where: str) -> bool:
    """``value`` as a bool, or a TypeError naming the argument: a string such as ``"no"`` would otherwise be read
    as true (numpy's bools are accepted)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{where}: {name} must be True or False, got {type(value).__name__} {value!r}")


def sequence_hint(value: object, dtype: np.dtype | str) -> str:
    """For a dtype mismatch: when ``value`` is a Python list, tuple or number rather than a numpy array, the
    dtype numpy gave it is numpy's choice, not the user's; say so and how to give the expected one."""
    if isinstance(value, (np.ndarray, np.generic)) or type(value).__name__ == "OrtValue":
        return ""
    return (f"; it is a Python {type(value).__name__}, which numpy reads as {np.asarray(value).dtype}: pass "
            f"np.asarray(value, dtype=np.{np.dtype(dtype).name})")
