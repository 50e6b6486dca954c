"""One owner per piece of state: no runtime module reads or writes another object's private members
(``other._x`` or ``self._other._x``); only onnx.reference's ``_run`` extension point is used through super()."""

from __future__ import annotations

import re
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "src" / "onnxtrain" / "runtime"
_FOREIGN = re.compile(r"(?<![\w.])(?!self\b|cls\b)(\w+)\._[a-z]|\bself\._\w+\._[a-z]")


def test_no_runtime_class_touches_another_objects_privates():
    found = []
    for path in sorted(RUNTIME.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0].replace("super()._run", "")
            code = re.sub(r"super\(\w+, self\)\._run", "", code)
            if _FOREIGN.search(code):
                found.append(f"{path.relative_to(RUNTIME)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
