"""Portable block-hash chains (contract K2).

Deterministic across processes and restarts: SHA-256 over explicit bytes, no
dependence on PYTHONHASHSEED or pickling. Used where an engine's own chain is
not portable, and by the demo.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

HASH_BYTES = 32


def chain_root(fingerprint: bytes, salt: bytes = b"") -> bytes:
    """Root of a chain: binds the namespace fingerprint and the tenant salt."""
    if len(fingerprint) != HASH_BYTES:
        raise ValueError(f"fingerprint must be {HASH_BYTES} bytes, got {len(fingerprint)}")
    h = hashlib.sha256(b"orbitkv-chain-v1\0")
    h.update(fingerprint)
    h.update(struct.pack("<I", len(salt)))
    h.update(salt)
    return h.digest()


def chain_hashes(
    tokens: Sequence[int], block_size: int, root: bytes, extra_keys: bytes = b""
) -> list[bytes]:
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


def fingerprint(**settings: object) -> bytes:
    """A namespace fingerprint from computation settings (canonical JSON)."""
    import json

    text = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(b"orbitkv-namespace-v1\0" + text.encode()).digest()
