"""Namespace fingerprints and portable block-hash chains (contracts K1, K2).

Deterministic across processes and restarts: SHA-256 over explicit bytes, no
dependence on PYTHONHASHSEED or pickling. `fingerprint` is the one definition
of a namespace fingerprint (the vLLM adapter's identity uses it too); chains are
used where an engine's own chain is not portable, and by the demo.

A tenant salt is not part of a chain: it is bound into the namespace by
`Client.register_namespace(..., salt=...)`, whose one encoding lives in the Rust
client (`orbitkv._native.namespace_salt`), so Rust and Python callers with the
same salt share a namespace and different salts never do (K3).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping, Sequence
from typing import Any

HASH_BYTES = 32


def canonical_json(doc: Mapping[str, Any]) -> bytes:
    """Canonical encoding: sorted keys, compact separators, ASCII only. Values must
    be JSON types (a TypeError otherwise, never a silent `str()`)."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def fingerprint(doc: Mapping[str, Any] | None = None, /, **settings: Any) -> bytes:
    """The 32-byte namespace fingerprint of a settings document (a mapping and/or
    keywords, merged): SHA-256 over a domain tag and its canonical JSON."""
    merged = {**(doc or {}), **settings}
    return hashlib.sha256(b"orbitkv-namespace-v1\0" + canonical_json(merged)).digest()


def chain_root(fingerprint: bytes) -> bytes:
    """Root of a chain: binds the namespace fingerprint."""
    if len(fingerprint) != HASH_BYTES:
        raise ValueError(f"fingerprint must be {HASH_BYTES} bytes, got {len(fingerprint)}")
    h = hashlib.sha256(b"orbitkv-chain-v1\0")
    h.update(fingerprint)
    return h.digest()


def chain_hashes(tokens: Sequence[int], block_size: int, root: bytes, extra_keys: bytes = b"") -> list[bytes]:
    """One 32-byte hash per *complete* block of `tokens`; block i depends on
    every token of blocks 0..i, so equal hashes mean equal prefixes."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    out: list[bytes] = []
    parent = root
    full = len(tokens) - len(tokens) % block_size
    for start in range(0, full, block_size):
        h = hashlib.sha256(parent)
        h.update(struct.pack(f"<{block_size}I", *tokens[start : start + block_size]))
        h.update(struct.pack("<I", len(extra_keys)))
        h.update(extra_keys)
        parent = h.digest()
        out.append(parent)
    return out
