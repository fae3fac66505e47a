"""OrbitKV settings for the vLLM adapter, read from `kv_connector_extra_config`.

Every key lives under the `orbitkv.` prefix so it can sit beside other connectors'
keys (for example inside a MultiConnector child). Unknown `orbitkv.*` keys are an
error: a typo must not silently fall back to a default. This module imports no vLLM,
no torch and nothing native.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

PREFIX = "orbitkv."


class Mode(StrEnum):
    """What the connector does with the Manager (contract V4)."""

    READ_WRITE = "read_write"  # look up + load, and save (default)
    SAVE_ONLY = "save_only"  # never look up or load; only save (e.g. P/D decode side)


class OrbitKVConfigError(ValueError):
    """A setting in `kv_connector_extra_config` is missing, malformed or unknown."""


# Layout names accepted by vLLM 0.31.0 (`vllm.v1.kv_cache_layout.KVCacheLayout`).
KV_CACHE_LAYOUTS = ("LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")

# `orbitkv.copy_engine`: who copies between KV pages and arena slots in the workers.
#   auto  - the native client (synchronous) for CPU pages, `orbitkv.kvcopy` (asynchronous,
#           on CUDA streams) for CUDA pages;
#   torch - `orbitkv.kvcopy` for CPU pages too (the asynchronous protocol on CPU).
COPY_ENGINES = ("auto", "torch")
# `orbitkv.copy_kernel`: how `orbitkv.kvcopy` copies CUDA pages (`CopyEngine(kernel=)`):
#   auto   - $ORBITKV_COPY_KERNEL if set, else the one-pass Triton kernel where Triton
#            imports and the pages allow it, else torch (the choice is logged);
#   triton - the one-pass Triton kernel; the worker fails at KV registration if it cannot run;
#   torch  - two-pass torch index ops through a staging buffer;
#   dma    - the GPU's copy engines (cudaMemcpyAsync of whole blocks through a staging
#            ring), pages placed on the device by the Triton kernel; refused like triton.
COPY_KERNELS = ("auto", "torch", "triton", "dma")


@dataclass(frozen=True)
class OrbitKVSettings:
    """Parsed, validated adapter settings (see docs/adapters.md for each key)."""

    socket_path: str | None = None
    token: str | None = None
    timeout_ms: int = 5000
    # The scheduler's calls (lookup, release) run inside vLLM's scheduler step: a
    # stalled Manager may hold the step at most this long, then requests miss.
    scheduler_timeout_ms: int = 250
    mode: Mode = Mode.READ_WRITE
    static_lora_adapters: Mapping[str, str] = field(default_factory=dict)
    model_identity: str | None = None
    kv_cache_layout: str | None = None
    load_workers: int = 2
    copy_engine: str = "auto"
    copy_kernel: str = "auto"
    # Tensor parallelism (contract T1): one TP lookup per request over every rank's
    # shard, its lease handed to the workers by token. Needs --enable-query-control
    # on the Manager; required for tensor_parallel_size > 1.
    query_control: bool = False
    # A request whose first block the Manager's presence table says may be present is
    # looked up on a background thread and vLLM asked to retry next step (it returns
    # None from get_num_new_matched_tokens); False: looked up inline on the scheduler
    # thread. A certain miss never sends a message either way.
    async_lookups: bool = True
    # With async_lookups: how long, in all, one scheduler step may wait for background
    # lookups to answer before the requests still waiting are asked again next step. A
    # local Manager answers in ~50-200 us, and a deferred request loses a whole engine
    # step (~7 ms for an 8B model on an H200), so the default waits up to 1 ms; 0 never
    # waits (the scheduler thread never blocks on the Manager).
    lookup_wait_us: int = 1000
    # How long, in all, one worker step may wait for the loads in flight to complete so
    # that they are reported in that step (their requests then run in the next step
    # instead of the one after). 0: never wait (a load is reported by a later step).
    load_wait_us: int = 0

    @property
    def loads(self) -> bool:
        return self.mode is Mode.READ_WRITE

    def uses_kvcopy(self, device_type: str) -> bool:
        """True when the workers copy through `orbitkv.kvcopy` (asynchronous loads and
        saves) for KV pages on `device_type` ("cpu", "cuda", ...); False: the native
        client's synchronous host copies. Both roles derive it from the same settings and
        vLLM device config, so the scheduler knows whether saves complete asynchronously."""
        return self.copy_engine == "torch" or device_type == "cuda"


MAX_LOOKUP_WAIT_US = 100_000
MAX_LOAD_WAIT_US = 1_000_000

_KEYS = {
    "socket_path",
    "token",
    "timeout_ms",
    "scheduler_timeout_ms",
    "mode",
    "static_lora_adapters",
    "model_identity",
    "kv_cache_layout",
    "load_workers",
    "copy_engine",
    "copy_kernel",
    "query_control",
    "async_lookups",
    "lookup_wait_us",
    "load_wait_us",
}


# Settings that take one of a few names: (the names, what they mean, for the error).
_CHOICES: dict[str, tuple[tuple[str, ...], str]] = {
    "copy_engine": (
        COPY_ENGINES,
        "auto: native copies for CPU pages, orbitkv.kvcopy for CUDA pages; torch: orbitkv.kvcopy always",
    ),
    "copy_kernel": (
        COPY_KERNELS,
        "triton: one-pass Triton kernel; torch: two-pass index ops; auto: triton where it runs",
    ),
}


# Waits in microseconds: (the most allowed, why).
_WAITS: dict[str, tuple[int, str]] = {
    "lookup_wait_us": (
        MAX_LOOKUP_WAIT_US,
        "100 ms: longer stalls the engine's scheduler; use async_lookups=false to wait for every answer",
    ),
    "load_wait_us": (MAX_LOAD_WAIT_US, "1 s: longer stalls the engine"),
}


def _expect_str(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise OrbitKVConfigError(f"{PREFIX}{key} must be a non-empty string, got {value!r}")
    return value


def _expect_choice(key: str, value: Any, choices: tuple[str, ...], meaning: str) -> str:
    if value not in choices:
        raise OrbitKVConfigError(f"{PREFIX}{key} must be one of {list(choices)}, got {value!r} ({meaning})")
    return str(value)


def _expect_int(key: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise OrbitKVConfigError(f"{PREFIX}{key} must be an integer >= {minimum}, got {value!r}")
    return value


def _expect_bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise OrbitKVConfigError(f"{PREFIX}{key} must be true or false, got {value!r}")
    return value


def _parse_adapters(value: Any) -> dict[str, str]:
    key = f"{PREFIX}static_lora_adapters"
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, list):
        items = []
        for entry in value:
            if not isinstance(entry, Mapping) or set(entry) != {"name", "path"}:
                raise OrbitKVConfigError(f"{key}: list entries must be {{'name': ..., 'path': ...}}, got {entry!r}")
            items.append((entry["name"], entry["path"]))
    else:
        raise OrbitKVConfigError(f"{key} must be a mapping name -> local PEFT directory")
    adapters: dict[str, str] = {}
    for name, path in items:
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise OrbitKVConfigError(f"{key}: adapter names and paths must be non-empty strings")
        if name in adapters:
            raise OrbitKVConfigError(f"{key}: adapter {name!r} declared twice")
        if not os.path.isdir(path):
            raise OrbitKVConfigError(
                f"{key}: adapter {name!r} path {path!r} is not a local directory "
                "(only local PEFT adapters can be fingerprinted at startup)"
            )
        adapters[name] = os.path.realpath(path)
    return adapters


def parse_settings(extra_config: Mapping[str, Any] | None) -> OrbitKVSettings:
    """Read the `orbitkv.*` keys; other keys are left to other connectors."""
    raw = {k[len(PREFIX) :]: v for k, v in (extra_config or {}).items() if k.startswith(PREFIX)}
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise OrbitKVConfigError(
            "unknown kv_connector_extra_config key(s): "
            + ", ".join(PREFIX + k for k in unknown)
            + f" (known: {', '.join(PREFIX + k for k in sorted(_KEYS))})"
        )
    kwargs: dict[str, Any] = {}
    for key in ("socket_path", "token", "model_identity"):
        if key in raw:
            kwargs[key] = _expect_str(key, raw[key])
    for key in ("timeout_ms", "scheduler_timeout_ms", "load_workers"):
        if key in raw:
            kwargs[key] = _expect_int(key, raw[key], 1)
    for key in ("query_control", "async_lookups"):
        if key in raw:
            kwargs[key] = _expect_bool(key, raw[key])
    for key, (choices, meaning) in _CHOICES.items():
        if key in raw:
            kwargs[key] = _expect_choice(key, raw[key], choices, meaning)
    if "mode" in raw:
        try:
            kwargs["mode"] = Mode(raw["mode"])
        except ValueError:
            raise OrbitKVConfigError(
                f"{PREFIX}mode must be one of {[m.value for m in Mode]}, got {raw['mode']!r}"
            ) from None
    if "static_lora_adapters" in raw:
        kwargs["static_lora_adapters"] = _parse_adapters(raw["static_lora_adapters"])
    if "kv_cache_layout" in raw:
        layout = raw["kv_cache_layout"]
        if layout not in KV_CACHE_LAYOUTS:
            raise OrbitKVConfigError(f"{PREFIX}kv_cache_layout must be one of {list(KV_CACHE_LAYOUTS)}, got {layout!r}")
        kwargs["kv_cache_layout"] = layout
    for key, (maximum, why) in _WAITS.items():
        if key in raw:
            kwargs[key] = _expect_int(key, raw[key], 0)
            if kwargs[key] > maximum:
                raise OrbitKVConfigError(f"{PREFIX}{key} must be at most {maximum} ({why}), got {kwargs[key]}")
    return OrbitKVSettings(**kwargs)
