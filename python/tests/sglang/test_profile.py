"""Profile guards, plugin discovery and settings of the OrbitKV SGLang backend (S1, S2, O4).

Every rejection happens in the backend factory, before any Manager connection, with an
error naming the setting.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sglang_env import ADAPTER_MODULE, REPO_PYTHON, V0_5_23, skip_module_if_unavailable

skip_module_if_unavailable()

from sglang_harness import PAGE, Engine  # noqa: E402
from sglang_pools import cpu_pool  # noqa: E402

pytestmark = pytest.mark.sglang

NO_MANAGER = "/tmp/orbitkv-sglang-tests-no-manager.sock"


def test_importing_the_adapter_and_the_plugin_loads_nothing_heavy() -> None:
    """O4: `import orbitkv.sglang` imports no SGLang, torch or native code; the plugin's
    register() imports SGLang's registry only (neither the native client, the copy engine
    nor the linker module, which holds the pool layout code)."""
    code = f"""
import sys, json
sys.path.insert(0, {str(REPO_PYTHON)!r})
import orbitkv.sglang
first = sorted(m for m in ("sglang", "torch", "orbitkv._native", "orbitkv.kvcopy") if m in sys.modules)
from orbitkv.sglang import plugin
plugin.register()
plugin.register()  # idempotent: SGLang may load plugins more than once per process
from sglang.srt.plugins.hook_registry import HookRegistry
HookRegistry.apply_hooks()  # what load_plugins() does next (0.5.23 applies the match_prefix hook)
from sglang.srt.mem_cache.registry import registered_radix_cache_backends
after = sorted(m for m in ("orbitkv._native", "orbitkv.kvcopy", "orbitkv.sglang._shared",
                           "orbitkv.sglang.v0_5_21", "orbitkv.sglang.v0_5_23", "orbitkv.vllm")
               if m in sys.modules)
hooks = [h.__qualname__ for t in (plugin.MATCH_PREFIX_TARGET, plugin.CHECKPOINT_TARGET)
         for _, h, _ in HookRegistry._hooks.get(t, [])]
print(json.dumps([first, after, registered_radix_cache_backends(), hooks]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    first, after, backends, hooks = json.loads(out.strip().splitlines()[-1])
    assert first == []
    assert after == []
    assert "orbitkv" in backends
    # 0.5.23: the caller-extra_key guard and the hint sender are registered once each;
    # 0.5.21 needs no hook (its cache is OrbitKV's subclass).
    assert hooks == (["match_prefix_hook", "checkpoint_hook"] if V0_5_23 else [])


def test_sglang_loads_the_installed_entry_point() -> None:
    """The wheel declares the `sglang.srt.plugins` entry point; SGLang's own load_plugins()
    (run in the launcher and every scheduler process) registers the backend."""
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps.get("orbitkv") == "orbitkv.sglang.plugin:register"
    code = """
import sys, json
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.mem_cache.registry import registered_radix_cache_backends
from importlib.metadata import version
applied = None
if version("sglang") == "0.5.23":
    from orbitkv.sglang.plugin import hooks_applied
    applied = hooks_applied()
print(json.dumps([registered_radix_cache_backends(), applied]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    backends, applied = json.loads(out.strip().splitlines()[-1])
    assert "orbitkv" in backends
    assert applied is (True if V0_5_23 else None)


def _ctx_error(engine_kwargs: dict, ctx_changes: dict) -> str:
    e = Engine(NO_MANAGER, build=False, **engine_kwargs)
    from sglang.srt.mem_cache.registry import create_tree_cache
    from sglang_harness import rank_override

    ctx = dataclasses.replace(e.context(), **ctx_changes)
    with pytest.raises(Exception) as info, rank_override():
        create_tree_cache(ctx)
    assert isinstance(info.value, adapter().UnsupportedProfileError), info.value
    e.close()
    return str(info.value)


def adapter() -> Any:
    return importlib.import_module(ADAPTER_MODULE)


ONLY_0_5_21_CTX = pytest.mark.skipif(
    V0_5_23,
    reason="0.5.21 backend-factory checks of TreeCacheBuildContext; 0.5.23's linker checks are "
    "test_0_5_23_linker_rejects_what_it_cannot_serve",
)


@pytest.mark.parametrize(
    ("ctx_changes", "needle"),
    [
        ({"is_hybrid_swa": True}, "sliding-window"),
        ({"is_hybrid_ssm": True}, "Mamba/SSM"),
        ({"is_dsa": True}, "DSA"),
        ({"enable_hierarchical_cache": True}, "--enable-hierarchical-cache"),
        ({"disable_radix_cache": True}, "--disable-radix-cache"),
        ({"tp_size": 2}, "--tp-size 2"),
    ],
)
@ONLY_0_5_21_CTX
def test_unsupported_models_and_parallelism_are_rejected(ctx_changes: dict, needle: str) -> None:
    assert needle in _ctx_error({}, ctx_changes)


@pytest.mark.parametrize(
    ("server_args", "needle"),
    [
        pytest.param(
            {"enable_unified_cache_external_linker": False},
            "--enable-unified-cache-external-linker",
            marks=pytest.mark.skipif(
                V0_5_23, reason="0.5.23 reads the dynamic linker config only with this flag: OrbitKV is not selected"
            ),
        ),
        ({"enable_session_radix_cache": True}, "--enable-session-radix-cache"),
        ({"enable_streaming_session": True}, "--enable-streaming-session"),
    ],
)
def test_unsupported_settings_are_rejected(server_args: dict, needle: str) -> None:
    assert needle in _ctx_error({"server_args": server_args}, {})


@pytest.mark.skipif(not V0_5_23, reason="0.5.23 only")
def test_0_5_23_linker_rejects_what_it_cannot_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.5.23 builds the stock cache and constructs the linker itself (dynamic backend):
    the linker's constructor rejects hybrid components and TP > 1, naming them."""
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang_harness import rank_override

    from orbitkv.sglang.v0_5_23 import OrbitKVLinker, UnsupportedProfileError

    e = Engine(NO_MANAGER, build=False)
    for comps, needle in (
        ({ComponentType.FULL, ComponentType.SWA}, "['SWA']"),
        ({ComponentType.FULL, ComponentType.MAMBA}, "['MAMBA']"),
    ):
        with rank_override(), pytest.raises(UnsupportedProfileError, match=re.escape(needle)):
            OrbitKVLinker(e.args, e.params, components=comps)
    from sglang.srt.runtime_context import get_parallel

    with (
        get_parallel().override(attn_tp_rank=0, attn_tp_size=2, tp_rank=0, tp_size=2, moe_tp_size=2),
        pytest.raises(UnsupportedProfileError, match="--tp-size 2"),
    ):
        OrbitKVLinker(e.args, e.params, components={ComponentType.FULL})
    # Settings come from linker_extra_config and are validated like ORBITKV_SGLANG_CONFIG.
    with rank_override(), pytest.raises(Exception, match=r"unknown OrbitKV SGLang setting 'orbitkv\.sokcet_path'"):
        OrbitKVLinker(e.args, e.params, components={ComponentType.FULL}, extra_config={"orbitkv.sokcet_path": "/x"})


@pytest.mark.skipif(not V0_5_23, reason="0.5.23 only")
def test_0_5_23_radix_cache_backend_flag_names_the_dynamic_linker() -> None:
    """`--radix-cache-backend orbitkv` (the 0.5.21 selection) fails on 0.5.23 with the flags to use."""
    args = {"enable_unified_cache_external_linker": False, "radix_cache_backend": "orbitkv"}
    msg = _ctx_error({"server_args": args}, {})
    assert "--unified-cache-external-linker-backend dynamic" in msg and "orbitkv.sglang.v0_5_23" in msg


@pytest.mark.skipif(not V0_5_23, reason="0.5.23 only")
def test_0_5_23_linker_refuses_to_run_without_the_extra_key_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the plugin's match_prefix hook (entry point not loaded), the linker refuses to start."""
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang_harness import rank_override

    from orbitkv.sglang import plugin
    from orbitkv.sglang.v0_5_23 import OrbitKVLinker, UnsupportedProfileError

    e = Engine(NO_MANAGER, build=False)
    monkeypatch.setattr(plugin, "hooks_applied", lambda: False)
    with rank_override(), pytest.raises(UnsupportedProfileError, match="match_prefix hook"):
        OrbitKVLinker(e.args, e.params, components={ComponentType.FULL})


def test_unknown_and_hybrid_pools_are_rejected() -> None:
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    UnsupportedProfileError, describe_pool = adapter().UnsupportedProfileError, adapter().describe_pool

    class SomeFuturePool(MHATokenToKVPool):
        pass

    pool = cpu_pool("mha", pages=16, page=PAGE, layers=1, heads=1, cls=SomeFuturePool)
    with pytest.raises(UnsupportedProfileError, match="SomeFuturePool is not supported"):
        describe_pool(pool, PAGE)
    with pytest.raises(UnsupportedProfileError, match="HybridLinearKVPool"):
        from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool

        describe_pool(HybridLinearKVPool.__new__(HybridLinearKVPool), PAGE)


def test_dense_pool_geometry_matches_the_released_buffers() -> None:
    e = Engine(NO_MANAGER)
    g = adapter().describe_pool(e.kv, PAGE)
    row = 2 * 8 * 2  # heads * head_dim * bf16
    assert g.kind == "mha" and len(g.layers) == 6  # K and V of 3 layers, interleaved
    assert g.block_bytes == 6 * PAGE * row
    # Each layer page view starts where the released buffer does (0.5.23 allocates the K/V
    # buffers of all layers as views of one tensor, so compare addresses, not storages).
    assert [lp.backing.data_ptr() + lp.base for lp in g.layers] == [b.data_ptr() for b in e.buffers]
    assert g.num_pages == e.kv.k_buffer[0].shape[0] // PAGE
    e.close()


def test_settings_are_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    from orbitkv.sglang import OrbitKVSGLangConfigError, parse_settings

    s = parse_settings(json.dumps({"orbitkv.socket_path": "/x.sock", "orbitkv.timeout_ms": 100}))
    assert (s.socket_path, s.timeout_ms) == ("/x.sock", 100)
    with pytest.raises(OrbitKVSGLangConfigError, match=r"unknown OrbitKV SGLang setting 'orbitkv\.sokcet_path'"):
        parse_settings({"orbitkv.sokcet_path": "/x.sock"})
    with pytest.raises(OrbitKVSGLangConfigError, match="timeout_ms must be an integer >= 1"):
        parse_settings({"orbitkv.timeout_ms": 0})
    monkeypatch.setenv("ORBITKV_SGLANG_CONFIG", "{not json")
    with pytest.raises(OrbitKVSGLangConfigError, match="not valid JSON"):
        parse_settings()


def test_unreachable_manager_costs_only_misses(tmp_path: Path) -> None:
    e = Engine(str(tmp_path / "nobody.sock"))
    from sglang_harness import prompt

    tokens = prompt(21, 3)
    for _ in range(2):
        got = e.serve(tokens)
        assert got.mismatched_bytes == 0
    assert e.linker.stats["offloaded_blocks"] == 0 and e.linker.stats["lookup_hit_blocks"] == 0
    e.close()
