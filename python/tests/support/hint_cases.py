"""Malformed retention hints and the reason each must be refused with (shared by the
vLLM and SGLang adapter suites: both validate with `orbitkv.engine.hints.parse_hint`)."""

from __future__ import annotations

MALFORMED_HINTS: list[tuple[object, str]] = [
    ({"keep": 5}, "unknown key"),
    ({"keep_for_s": 5, "done": True}, "exactly one of"),
    ({"keep_for_s": 0}, "24 hours"),
    ({"keep_for_s": "soon"}, "number of seconds"),
    ({"done": False}, "'done' must be true"),
    ("forever", "must be an object"),
]
