"""`orbitkv.engine.hints.parse_hint`: the hints an application may pass, and the reason
each malformed one is refused with."""

from __future__ import annotations

import pytest

from orbitkv.engine.hints import PARAM, HintError, RetentionHint, parse_hint


def test_no_parameters_or_no_hint_is_no_hint() -> None:
    assert parse_hint(None) is None
    assert parse_hint({}) is None
    assert parse_hint({"do_remote_prefill": True}) is None


def test_keep_and_done_parse_to_the_client_arguments() -> None:
    keep = parse_hint({PARAM: {"keep_for_s": 120}})
    assert keep == RetentionHint(keep_for_s=120.0) and keep.as_kwargs() == {"keep_for_s": 120.0}
    done = parse_hint({PARAM: {"done": True}})
    assert done == RetentionHint(done=True) and done.as_kwargs() == {"done": True}
    assert parse_hint({PARAM: {"keep_for_s": 0.001}}) == RetentionHint(keep_for_s=0.001)
    assert parse_hint({PARAM: {"keep_for_s": 86_400}}) == RetentionHint(keep_for_s=86_400.0)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("120", "must be an object"),
        ([120], "must be an object"),
        ({}, "exactly one of"),
        ({"keep_for_s": 1, "done": True}, "exactly one of"),
        ({"keep_for_s": 1, "session": "s1"}, "unknown key(s) 'session'"),
        ({"done": 1}, "'done' must be true"),
        ({"done": False}, "'done' must be true"),
        ({"keep_for_s": True}, "number of seconds"),
        ({"keep_for_s": "60"}, "number of seconds"),
        ({"keep_for_s": float("inf")}, "number of seconds"),
        ({"keep_for_s": float("nan")}, "number of seconds"),
        ({"keep_for_s": 0}, "24 hours"),
        ({"keep_for_s": -5}, "24 hours"),
        ({"keep_for_s": 86_401}, "24 hours"),
    ],
)
def test_malformed_hints_are_refused_with_their_reason(raw: object, reason: str) -> None:
    with pytest.raises(HintError, match=reason.replace("(", r"\(").replace(")", r"\)")) as e:
        parse_hint({PARAM: raw})
    assert PARAM in str(e.value)
