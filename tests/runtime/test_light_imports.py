"""The on-device runtime imports only numpy, onnx, onnxruntime and safetensors (plus the standard library)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

HEAVY = ("torch", "flwr", "ray", "tqdm", "matplotlib", "sklearn", "scipy", "PIL", "pandas", "hypothesis")


def test_runtime_does_not_import_optional_packages(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        from onnxtrain.api import CheckpointState, Module, Optimizer, LinearLRScheduler  # noqa: F401
        import onnxtrain.api.checkpoint_state, onnxtrain.api.module, onnxtrain.api.optimizer  # noqa: F401, E401
        import onnxtrain.api.lr_scheduler  # noqa: F401
        import onnxtrain.artifacts  # noqa: F401
        import onnxtrain.cli.main  # noqa: F401  (the CLI imports its extras lazily)
        loaded = {{m.split(".")[0] for m in sys.modules}}
        print(sorted(loaded & set({HEAVY!r})))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"optional packages imported at run time: {out.stdout.strip()}"
