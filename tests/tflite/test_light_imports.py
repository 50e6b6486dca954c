"""Exporting back to a flatbuffer, and the runtime, never import the flatbuffer schema packages."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_write_back_needs_no_schema_package():
    script = textwrap.dedent("""
        import sys
        import onnxtrain.api, onnxtrain.cli.main, onnxtrain.tflite  # noqa: F401
        from onnxtrain.tflite import SourceRecord, write_back  # noqa: F401
        from onnxtrain.tflite.export import export_flatbuffer  # noqa: F401
        loaded = {m.split(".")[0] for m in sys.modules}
        print(sorted(loaded & {"tflite", "circle_schema", "flatbuffers", "ai_edge_litert", "tensorflow"}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"schema packages imported: {out.stdout.strip()}"
