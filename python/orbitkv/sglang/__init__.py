"""OrbitKV adapter for SGLang 0.5.21 (UnifiedRadixCache + external linker).

Launch SGLang with `--radix-cache-backend orbitkv --enable-unified-cache-external-linker`.
The `sglang.srt.plugins` entry point `orbitkv` (`orbitkv.sglang.plugin:register`)
registers the backend in every SGLang process. Importing this package imports neither
SGLang, torch, nor the native runtime (O4); the linker module is imported by the
backend factory when SGLang builds its tree cache.
"""

from __future__ import annotations

from orbitkv.sglang.config import OrbitKVSGLangConfigError, SGLangSettings, parse_settings

PINNED_SGLANG = "0.5.21"
BACKEND_NAME = "orbitkv"

__all__ = ["BACKEND_NAME", "PINNED_SGLANG", "OrbitKVSGLangConfigError", "SGLangSettings", "parse_settings"]
