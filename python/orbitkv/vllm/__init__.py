"""OrbitKV adapter for vLLM 0.31.0, 0.33.0 and 0.34.0 (KV Connector V1; `compat` holds what differs).

`kv_connector_module_path="orbitkv.vllm"`, `kv_connector="OrbitKVConnector"`.

Importing this package imports neither vLLM, SGLang nor the native runtime (O4);
`OrbitKVConnector` is resolved on first attribute access, which imports vLLM, and the
native client is only loaded when a role first talks to the Manager.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orbitkv.engine.lazy import lazy_attributes
from orbitkv.vllm.config import Mode, OrbitKVConfigError, OrbitKVSettings, parse_settings

if TYPE_CHECKING:
    from orbitkv.vllm.connector import OrbitKVConnector
    from orbitkv.vllm.errors import UnsupportedProfileError
    from orbitkv.vllm.metadata import OrbitKVConnectorMetadata

__all__ = [
    "Mode",
    "OrbitKVConfigError",
    "OrbitKVConnector",
    "OrbitKVConnectorMetadata",
    "OrbitKVSettings",
    "UnsupportedProfileError",
    "parse_settings",
]

_LAZY = {
    "OrbitKVConnector": "orbitkv.vllm.connector",
    "OrbitKVConnectorMetadata": "orbitkv.vllm.metadata",
    "UnsupportedProfileError": "orbitkv.vllm.errors",
}


__getattr__ = lazy_attributes(__name__, _LAZY, globals())
