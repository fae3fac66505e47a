"""The `sglang.srt.plugins` entry point: registers the `orbitkv` radix-cache backend.

SGLang calls `register()` in the launcher and in every scheduler process (spawned), so
the registration exists where the tree cache is built. Only SGLang's registry module is
imported here; the factory imports the linker (torch, SGLang's cache, the native client)
when SGLang actually builds a cache with `--radix-cache-backend orbitkv`.
"""

from __future__ import annotations

import importlib
from importlib.metadata import version
from typing import Any

from orbitkv.sglang import BACKEND_NAME, PINNED_SGLANG


class UnsupportedSGLangVersion(RuntimeError):
    """The installed SGLang is not a release this adapter is qualified for."""


def _linker_module() -> str:
    installed = version("sglang")
    if installed != PINNED_SGLANG:
        raise UnsupportedSGLangVersion(
            f"--radix-cache-backend {BACKEND_NAME}: the OrbitKV SGLang adapter is qualified for "
            f"sglang=={PINNED_SGLANG} only, found {installed}"
        )
    return "orbitkv.sglang.v0_5_21"


def orbitkv_factory(ctx: Any) -> Any:
    """`RadixCacheFactory` for `--radix-cache-backend orbitkv` (imports the linker lazily)."""
    return importlib.import_module(_linker_module()).build_tree_cache(ctx)


def register() -> None:
    """Register the backend once per process (idempotent)."""
    from sglang.srt.mem_cache.registry import get_radix_cache_factory, register_radix_cache_backend

    if get_radix_cache_factory(BACKEND_NAME) is None:
        register_radix_cache_backend(BACKEND_NAME, orbitkv_factory)
