"""OrbitKV adapter for SGLang 0.5.21 and 0.5.23 (UnifiedRadixCache + external linker).

One module per release (`v0_5_21.py`, `v0_5_23.py`), selected by the installed version;
any other release is refused, naming it. 0.5.21: launch SGLang with
`--radix-cache-backend orbitkv --enable-unified-cache-external-linker`; 0.5.23: with its
dynamic linker backend (see `v0_5_23.py`, docs/adapters.md). The `sglang.srt.plugins`
entry point `orbitkv` (`orbitkv.sglang.plugin:register`) runs in every SGLang process.
Importing this package imports neither SGLang, torch, nor the native runtime (O4); the
per-release module is imported when SGLang builds its tree cache or linker.
"""

from __future__ import annotations

from orbitkv.sglang.config import OrbitKVSGLangConfigError, SGLangSettings, parse_settings

QUALIFIED_SGLANG = ("0.5.21", "0.5.23")
BACKEND_NAME = "orbitkv"

__all__ = ["BACKEND_NAME", "QUALIFIED_SGLANG", "OrbitKVSGLangConfigError", "SGLangSettings", "parse_settings"]
