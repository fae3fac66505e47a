"""OrbitKV: a KV-cache manager for LLM serving.

`orbitkv.Client` (native, Rust) talks to the per-host Manager. Importing this
package loads nothing native and imports no engine: the native module is
loaded on first attribute access (contract O4).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_NATIVE_NAMES = {
    "Client",
    "Namespace",
    "Lease",
    "TpLease",
    "SaveResult",
    "PendingSave",
    "PageLayout",
    "OrbitKVError",
    "ManagerUnavailable",
    "AuthError",
    "ProtocolError",
    "Busy",
    "RestoreFailed",
    "SaveFailed",
    "HASH_BYTES",
    "PROTOCOL_VERSION",
    "default_socket_path",
    "namespace_salt",
}

if TYPE_CHECKING:
    from orbitkv._native import (  # noqa: F401
        HASH_BYTES,
        PROTOCOL_VERSION,
        AuthError,
        Busy,
        Client,
        Lease,
        ManagerUnavailable,
        Namespace,
        OrbitKVError,
        PageLayout,
        PendingSave,
        ProtocolError,
        RestoreFailed,
        SaveFailed,
        SaveResult,
        TpLease,
        default_socket_path,
        namespace_salt,
    )


def __getattr__(name: str) -> Any:
    if name in _NATIVE_NAMES:
        from orbitkv import _native

        return getattr(_native, name)
    raise AttributeError(f"module 'orbitkv' has no attribute {name!r}")


__all__ = sorted(_NATIVE_NAMES)
