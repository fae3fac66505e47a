"""The `sglang.srt.plugins` entry point: selects the per-release OrbitKV module.

SGLang calls `register()` in the launcher and in every scheduler process (spawned).
Only SGLang's registry (and, on 0.5.23, its plugin `HookRegistry`) is imported here;
the per-release linker module (torch, SGLang's cache, the native client) is imported
when SGLang actually builds a cache or a linker that uses OrbitKV.

- sglang 0.5.21: registers the `orbitkv` radix-cache backend
  (`--radix-cache-backend orbitkv`), built by `orbitkv.sglang.v0_5_21`.
- sglang 0.5.23: the linker is selected by SGLang's dynamic linker backend
  (`orbitkv.sglang.v0_5_23.OrbitKVLinker`); `register()` adds two AROUND hooks, inactive
  unless the cache's linker is OrbitKV's: the caller-`extra_key` guard on
  `UnifiedRadixCache.match_prefix`, and on `UnifiedRadixCache.checkpoint` the sending of
  a finished request's retention hint (`orbitkv.sglang.retention`). The `orbitkv` radix-cache backend is registered too,
  only to fail with the right launch flags.
- any other release: the backend and the linker refuse to start, naming the version.
"""

from __future__ import annotations

import importlib
from importlib.metadata import version
from typing import Any

from orbitkv.sglang import BACKEND_NAME, QUALIFIED_SGLANG

# One module per qualified release: never a fallback from one to another.
RELEASE_MODULES = {"0.5.21": "orbitkv.sglang.v0_5_21", "0.5.23": "orbitkv.sglang.v0_5_23"}
assert tuple(RELEASE_MODULES) == QUALIFIED_SGLANG
MATCH_PREFIX_TARGET = "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.match_prefix"
CHECKPOINT_TARGET = "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.checkpoint"


class UnsupportedSGLangVersion(RuntimeError):
    """The installed SGLang is not a release this adapter is qualified for."""


def release_module(installed: str | None = None) -> str:
    """The OrbitKV module for the installed SGLang release, or `UnsupportedSGLangVersion`."""
    installed = installed if installed is not None else version("sglang")
    module = RELEASE_MODULES.get(installed)
    if module is None:
        raise UnsupportedSGLangVersion(
            f"the OrbitKV SGLang adapter is qualified for sglang {' and '.join(QUALIFIED_SGLANG)} only, "
            f"found sglang {installed}"
        )
    return module


def orbitkv_factory(ctx: Any) -> Any:
    """`RadixCacheFactory` for `--radix-cache-backend orbitkv` (imports the linker lazily)."""
    try:
        module = release_module(version("sglang"))
    except UnsupportedSGLangVersion as exc:
        raise UnsupportedSGLangVersion(f"--radix-cache-backend {BACKEND_NAME}: {exc}") from None
    return importlib.import_module(module).build_tree_cache(ctx)


def match_prefix_hook(original: Any, cache: Any, *args: Any, **kwargs: Any) -> Any:
    """0.5.23: the caller-`extra_key` guard, only on a cache whose linker is OrbitKV's
    (any other cache gets the release's call and imports nothing of OrbitKV)."""
    linker = getattr(getattr(cache, "linker", None), "cache_linker", None)
    if not getattr(linker, "orbitkv_rejects_caller_extra_key", False):
        return original(cache, *args, **kwargs)
    return importlib.import_module("orbitkv.sglang.v0_5_23").match_prefix_hook(original, cache, *args, **kwargs)


def checkpoint_hook(original: Any, cache: Any, *args: Any, **kwargs: Any) -> Any:
    """0.5.23: a finished request's retention hint, only on a cache whose linker is
    OrbitKV's (any other cache gets the release's call and imports nothing of OrbitKV)."""
    linker = getattr(getattr(cache, "linker", None), "cache_linker", None)
    if not getattr(linker, "orbitkv_rejects_caller_extra_key", False):
        return original(cache, *args, **kwargs)
    return importlib.import_module("orbitkv.sglang.v0_5_23").checkpoint_hook(original, cache, *args, **kwargs)


_HOOKS = ((MATCH_PREFIX_TARGET, match_prefix_hook), (CHECKPOINT_TARGET, checkpoint_hook))


def register() -> None:
    """Register the backend (and on 0.5.23 the two hooks) once per process (idempotent)."""
    from sglang.srt.mem_cache.registry import get_radix_cache_factory, register_radix_cache_backend

    if get_radix_cache_factory(BACKEND_NAME) is None:
        register_radix_cache_backend(BACKEND_NAME, orbitkv_factory)
    if version("sglang") == "0.5.23":
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        for target, fn in _HOOKS:
            if not any(hook is fn for _, hook, _ in HookRegistry._hooks.get(target, [])):
                HookRegistry.register(target, fn, HookType.AROUND)


def hooks_applied() -> bool:
    """True when the 0.5.23 hooks (the guard and the hint sender) are registered and
    applied in this process."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    return all(
        target in HookRegistry._patched and any(hook is fn for _, hook, _ in HookRegistry._hooks.get(target, []))
        for target, fn in _HOOKS
    )
