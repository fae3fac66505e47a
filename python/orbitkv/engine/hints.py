"""Retention hints: what an application knows about a request's KV cache.

An application passes, with a request, whether its prefix will be asked for again:

    kv_transfer_params={"orbitkv_retention": {"keep_for_s": 120}}   # expected back within 120 s
    kv_transfer_params={"orbitkv_retention": {"done": True}}        # not expected back

(vLLM: the request's `kv_transfer_params`; SGLang: the request's `custom_params`.) When
the request finishes, the adapter tells the Manager for the request's whole block chain:
a chat turn's chain is the conversation so far, so "the conversation continues" is a keep
and "the conversation ended" is done. The Manager keeps kept blocks ahead of everything
unhinted until the deadline (within `--retain-share` of DRAM, displacing only the same
namespace's blocks expected back later), and evicts done blocks first. Requests without
a hint behave as before.

`parse_hint` validates: a malformed hint raises `HintError` with the reason; the adapters
log it, count it (`hints_rejected`) and run the request without the hint. Applications
can call `parse_hint` on their own parameters before sending them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PARAM = "orbitkv_retention"
MAX_KEEP_S = 86_400.0
MIN_KEEP_S = 0.001
_KEYS = ("keep_for_s", "done")


class HintError(ValueError):
    """A retention hint that cannot be used, with the reason."""


@dataclass(frozen=True)
class RetentionHint:
    """Exactly one of: expected back within `keep_for_s` seconds, or `done`."""

    keep_for_s: float | None = None
    done: bool = False

    def as_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `orbitkv.Client.retain`."""
        if self.done:
            return {"done": True}
        return {"keep_for_s": self.keep_for_s}


def parse_hint(params: Mapping[str, Any] | None) -> RetentionHint | None:
    """The retention hint in a request's parameters: None without one, `HintError` for
    one that is malformed (not a mapping, unknown keys, both or neither of `keep_for_s`
    and `done`, a duration that is not a number of seconds from 0.001 to 86400)."""
    if not params or PARAM not in params:
        return None
    raw = params[PARAM]
    if not isinstance(raw, Mapping):
        raise HintError(f"{PARAM} must be an object such as {{'keep_for_s': 120}}, got {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in _KEYS)
    if unknown:
        raise HintError(f"{PARAM}: unknown key(s) {', '.join(map(repr, unknown))}; expected 'keep_for_s' or 'done'")
    if ("keep_for_s" in raw) == ("done" in raw):
        raise HintError(f"{PARAM} takes exactly one of 'keep_for_s' (seconds) or 'done': true")
    if "done" in raw:
        if raw["done"] is not True:
            raise HintError(f"{PARAM}: 'done' must be true (leave the hint out otherwise), got {raw['done']!r}")
        return RetentionHint(done=True)
    keep = raw["keep_for_s"]
    if isinstance(keep, bool) or not isinstance(keep, int | float) or not math.isfinite(keep):
        raise HintError(f"{PARAM}: 'keep_for_s' must be a number of seconds, got {keep!r}")
    if not MIN_KEEP_S <= keep <= MAX_KEEP_S:
        raise HintError(f"{PARAM}: 'keep_for_s' must be from {MIN_KEEP_S} to {MAX_KEEP_S:.0f} (24 hours), got {keep}")
    return RetentionHint(keep_for_s=float(keep))
