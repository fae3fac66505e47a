"""OrbitKV settings for the SGLang adapter.

SGLang 0.5.21 has no configuration channel for a third-party radix-cache backend, so
the settings come from one JSON document in the environment variable
`ORBITKV_SGLANG_CONFIG` (keys with the `orbitkv.` prefix, as in the vLLM adapter);
unknown keys are an error. No SGLang, torch or native import here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PREFIX = "orbitkv."
ENV = "ORBITKV_SGLANG_CONFIG"


class OrbitKVSGLangConfigError(ValueError):
    """A setting is missing, malformed or unknown, or the SGLang profile is unsupported."""


@dataclass(frozen=True)
class SGLangSettings:
    socket_path: str | None = None
    token: str | None = None
    # Every Manager call runs inside SGLang's scheduler step (match, admission, event
    # polling): a stalled Manager may hold a step at most this long, then the request misses.
    timeout_ms: int = 250
    model_identity: str | None = None


_KEYS = {"socket_path", "token", "timeout_ms", "model_identity"}


def parse_settings(doc: Mapping[str, Any] | str | None = None) -> SGLangSettings:
    """Parse `doc` (a mapping or JSON text; default: `$ORBITKV_SGLANG_CONFIG`)."""
    if doc is None:
        doc = os.environ.get(ENV) or "{}"
    if isinstance(doc, str):
        try:
            doc = json.loads(doc)
        except json.JSONDecodeError as exc:
            raise OrbitKVSGLangConfigError(f"{ENV} is not valid JSON: {exc}") from None
    if not isinstance(doc, Mapping):
        raise OrbitKVSGLangConfigError(f"{ENV} must be a JSON object, got {type(doc).__name__}")
    raw: dict[str, Any] = {}
    for key, value in doc.items():
        if not isinstance(key, str) or not key.startswith(PREFIX) or key[len(PREFIX) :] not in _KEYS:
            raise OrbitKVSGLangConfigError(
                f"unknown OrbitKV SGLang setting {key!r} (known: {', '.join(PREFIX + k for k in sorted(_KEYS))})"
            )
        raw[key[len(PREFIX) :]] = value
    kwargs: dict[str, Any] = {}
    for key in ("socket_path", "token", "model_identity"):
        if key in raw:
            if not isinstance(raw[key], str) or not raw[key]:
                raise OrbitKVSGLangConfigError(f"{PREFIX}{key} must be a non-empty string, got {raw[key]!r}")
            kwargs[key] = raw[key]
    for key in ("timeout_ms",):
        if key in raw:
            v = raw[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise OrbitKVSGLangConfigError(f"{PREFIX}{key} must be an integer >= 1, got {v!r}")
            kwargs[key] = v
    return SGLangSettings(**kwargs)
