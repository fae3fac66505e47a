"""Namespace identity shared by the engine adapters (contracts K1, K2, K4).

The namespace fingerprint (`orbitkv.hashing.fingerprint`, the one definition) is
SHA-256 over a domain tag and a canonical JSON document (sorted keys, no
whitespace, ASCII) holding everything that makes two engines' KV bytes
interchangeable: model identity, dtypes, KV layout and geometry, block size, parallel
rank/size, attention backend and the static LoRA fingerprint. It depends on nothing
process-local (no PYTHONHASHSEED, no object ids, no dict order), so every process that
is given the same configuration computes the same 32 bytes. Each adapter decides what
goes into its document (its own schema tag); the helpers here hash the files that
document binds (LoRA adapters, a local model's config). No engine import here.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

# One definition of the fingerprint for every caller (re-exported here).
from orbitkv.hashing import canonical_json, fingerprint

__all__ = [
    "adapter_digest",
    "canonical_json",
    "fingerprint",
    "model_config_digest",
    "sha256_file",
    "static_lora_identity",
]

# Files of a local PEFT adapter that determine its computation.
_ADAPTER_SUFFIXES = (".json", ".safetensors", ".bin", ".pt", ".model")


def sha256_file(path: str, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def adapter_digest(path: str) -> dict[str, str]:
    """SHA-256 of every file of a local PEFT adapter that affects its computation.

    Keys are paths relative to the adapter directory (POSIX separators), so the same
    adapter copied to another directory or host gives the same digest. An adapter
    without `adapter_config.json` is not a PEFT adapter and is refused.
    """
    if not os.path.isfile(os.path.join(path, "adapter_config.json")):
        raise ValueError(f"LoRA adapter {path!r} has no adapter_config.json (not a PEFT adapter)")
    files: dict[str, str] = {}
    for root, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names):
            if not name.endswith(_ADAPTER_SUFFIXES):
                continue
            full = os.path.join(root, name)
            rel = os.path.relpath(full, path).replace(os.sep, "/")
            files[rel] = sha256_file(full)
    if not any(name.endswith((".safetensors", ".bin", ".pt")) for name in files):
        raise ValueError(f"LoRA adapter {path!r} has no weight file (.safetensors/.bin/.pt)")
    return files


def static_lora_identity(adapters: Mapping[str, str], lora_settings: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Startup fingerprint of the declared adapters plus the effective LoRA settings.

    Returns None when LoRA is off and nothing is declared. The adapter *names* and
    contents are bound (vLLM keys blocks by name and path, so replacing the files at
    the same path would otherwise alias); the absolute paths are not, so identical
    adapters at different paths on different hosts still share.
    """
    if lora_settings is None and not adapters:
        return None
    return {
        "settings": dict(lora_settings) if lora_settings is not None else None,
        "adapters": {name: adapter_digest(path) for name, path in sorted(adapters.items())},
    }


def model_config_digest(model: str) -> str | None:
    """SHA-256 of `config.json` when the model is a local directory, else None."""
    candidate = os.path.join(model, "config.json")
    if os.path.isfile(candidate):
        return sha256_file(candidate)
    return None
