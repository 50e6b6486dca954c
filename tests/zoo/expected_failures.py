"""Placeholders: zoo checks that fail today, with the error a user sees (strict xfails in test_zoo.py).

Keys are (model, exporter) for every check of that export, or (model, exporter, check) for one check
(check: generates, base, batch, size, trains, exports). Remove an entry when its fix lands: a strict xfail
that passes fails the run.
"""

_STATIC_SPATIAL = "ValueError: ... (Conv): the gradient needs static spatial dimensions (issue 12, item 1)"

EXPECTED_FAILURES: dict[tuple[str, ...], str] = {}
