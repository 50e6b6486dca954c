"""Import torchvision beside the CPU build of torch."""

from __future__ import annotations

import sys
import types


def import_torchvision():
    """``import torchvision``, working around a wheel mismatch only when the plain import fails.

    The torchvision 0.28.0 wheel on PyPI is a CUDA build; next to the CPU build of torch 2.13 its
    ``_meta_registrations`` module fails at import with ``RuntimeError: operator torchvision::nms does not
    exist`` (it registers fake kernels for the compiled ops the CPU torch does not load). The model
    definitions do not need those ops, so an empty stand-in for that one module lets the rest import.
    """
    try:
        import torchvision
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        import torchvision
    return torchvision
