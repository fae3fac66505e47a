"""Which of vLLM's block-hash chains OrbitKV can key by, and what binds them (contract K2).

vLLM 0.31.0 (`vllm/utils/hashing.py`, `vllm/v1/core/kv_cache_utils.py`) hashes each
block as `hash_fn((parent_hash, token_ids, extra_keys))`, the first parent being
`NONE_HASH = hash_fn(seed)`:

* `sha256` (the default): SHA-256 of `pickle.dumps(input, protocol=pickle.HIGHEST_PROTOCOL)`.
  The digest is portable exactly as far as those pickle bytes are: they depend on the
  pickle protocol (`HIGHEST_PROTOCOL` is chosen by the interpreter) and on the pickler
  implementation and version that writes bytes, ints, strs, tuples and None. So the
  interpreter (implementation, major.minor), the protocol number and the pickler module
  are bound into the namespace: engines whose pickles could differ never share.
* `sha256_cbor`: SHA-256 of canonical CBOR (`cbor2.dumps(input, canonical=True)`), a
  byte format defined independently of Python; the CBOR serialisation is named.
* the seed: `PYTHONHASHSEED` when set, else the fixed `"vllm-none-hash"` for both
  cryptographic algorithms. The resolved `NONE_HASH` itself is bound, so engines
  with different seeds get different namespaces (their hashes differ anyway).
* `xxhash` / `xxhash_cbor`: without `PYTHONHASHSEED` vLLM seeds them with random bytes
  per process (they are not collision resistant, so the seed is kept secret): no two
  processes agree. They also give 16-byte digests and the Manager keys blocks by 32
  bytes. Both are refused, naming the setting.

No Manager connection here; vLLM is imported by the caller's role only.
"""

from __future__ import annotations

import os
import pickle
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.config import VllmConfig

# Algorithms whose chain OrbitKV keys by, and how their input is serialised.
PORTABLE_ALGOS = ("sha256", "sha256_cbor")


class BlockHashError(ValueError):
    """The engine's block hashes cannot be a cross-process cache key."""


def check_hash_algo(algo: str) -> None:
    """Raise `BlockHashError` naming the setting for algorithms that cannot be shared."""
    if algo in PORTABLE_ALGOS:
        return
    if algo in ("xxhash", "xxhash_cbor"):
        seeded = os.environ.get("PYTHONHASHSEED") is not None
        why = (
            "its 128-bit digests are not collision resistant and do not fit the Manager's 32-byte block keys"
            if seeded
            else "without PYTHONHASHSEED vLLM seeds it with random bytes in every process, so "
            "no two engines (nor one engine after a restart) compute the same block hashes"
        )
        raise BlockHashError(
            f"OrbitKVConnector cannot share --prefix-caching-hash-algo {algo}: {why}; use the "
            "default --prefix-caching-hash-algo sha256 (or sha256_cbor)"
        )
    raise BlockHashError(
        f"OrbitKVConnector does not know --prefix-caching-hash-algo {algo!r}; use sha256 (the default) or sha256_cbor"
    )


def serialization_identity(algo: str) -> dict[str, Any]:
    """What the digests' bytes depend on besides the hash function and the seed."""
    if algo.endswith("_cbor"):
        return {"format": "cbor-canonical"}
    return {
        "format": "pickle",
        "protocol": pickle.HIGHEST_PROTOCOL,
        "pickler": pickle.Pickler.__module__,  # "_pickle" (C) or "pickle" (pure Python)
        "python": f"{sys.implementation.name}-{sys.version_info.major}.{sys.version_info.minor}",
    }


def none_hash(algo: str) -> bytes:
    """The chain's root, exactly as vLLM's `init_none_hash` derives it for `algo`."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import resolve_none_hash_seed

    fn = get_hash_fn_by_name(algo)
    return bytes(fn(resolve_none_hash_seed(fn)))


def block_hash_identity(vllm_config: VllmConfig) -> dict[str, Any]:
    """The namespace part that makes two engines' block hashes comparable."""
    algo = vllm_config.cache_config.prefix_caching_hash_algo
    check_hash_algo(algo)
    return {"algo": algo, "none_hash": none_hash(algo).hex(), "serialization": serialization_identity(algo)}
