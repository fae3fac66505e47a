"""Profile guards, plugin discovery and settings of the OrbitKV SGLang backend (S1, S2, O4).

Every rejection happens in the backend factory, before any Manager connection, with an
error naming the setting.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from sglang_env import REPO_PYTHON, skip_module_if_unavailable

skip_module_if_unavailable()

import torch  # noqa: E402
from sglang_harness import PAGE, Engine  # noqa: E402

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
from sglang.srt.mem_cache.registry import registered_radix_cache_backends
after = sorted(m for m in ("orbitkv._native", "orbitkv.kvcopy", "orbitkv.sglang.v0_5_21", "orbitkv.vllm")
               if m in sys.modules)
print(json.dumps([first, after, registered_radix_cache_backends()]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    first, after, backends = json.loads(out.strip().splitlines()[-1])
    assert first == []
    assert after == []
    assert "orbitkv" in backends


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
print(json.dumps(registered_radix_cache_backends()))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "orbitkv" in json.loads(out.strip().splitlines()[-1])


def _ctx_error(engine_kwargs: dict, ctx_changes: dict) -> str:
    e = Engine(NO_MANAGER, build=False, **engine_kwargs)
    from sglang.srt.mem_cache.registry import create_tree_cache
    from sglang.srt.runtime_context import get_parallel

    ctx = dataclasses.replace(e.context(), **ctx_changes)
    with pytest.raises(Exception) as info, get_parallel().override(attn_tp_rank=0, attn_tp_size=1):
        create_tree_cache(ctx)
    from orbitkv.sglang.v0_5_21 import UnsupportedProfileError

    assert isinstance(info.value, UnsupportedProfileError), info.value
    e.close()
    return str(info.value)


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
def test_unsupported_models_and_parallelism_are_rejected(ctx_changes: dict, needle: str) -> None:
    assert needle in _ctx_error({}, ctx_changes)


@pytest.mark.parametrize(
    ("server_args", "needle"),
    [
        ({"enable_unified_cache_external_linker": False}, "--enable-unified-cache-external-linker"),
        ({"enable_session_radix_cache": True}, "--enable-session-radix-cache"),
        ({"enable_streaming_session": True}, "--enable-streaming-session"),
    ],
)
def test_unsupported_settings_are_rejected(server_args: dict, needle: str) -> None:
    assert needle in _ctx_error({"server_args": server_args}, {})


def test_unknown_and_hybrid_pools_are_rejected() -> None:
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    from orbitkv.sglang.v0_5_21 import UnsupportedProfileError, describe_pool

    class SomeFuturePool(MHATokenToKVPool):
        pass

    pool = SomeFuturePool(
        size=16 * PAGE,
        page_size=PAGE,
        dtype=torch.bfloat16,
        head_num=1,
        head_dim=8,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
        enable_alt_stream=False,
    )
    with pytest.raises(UnsupportedProfileError, match="SomeFuturePool is not supported"):
        describe_pool(pool, PAGE)
    with pytest.raises(UnsupportedProfileError, match="HybridLinearKVPool"):
        from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool

        describe_pool(HybridLinearKVPool.__new__(HybridLinearKVPool), PAGE)


def test_dense_pool_geometry_matches_the_released_buffers() -> None:
    e = Engine(NO_MANAGER)
    from orbitkv.sglang.v0_5_21 import describe_pool

    g = describe_pool(e.kv, PAGE)
    row = 2 * 8 * 2  # heads * head_dim * bf16
    assert g.kind == "mha" and len(g.layers) == 6  # K and V of 3 layers, interleaved
    assert g.block_bytes == 6 * PAGE * row
    assert [lp.backing.data_ptr() for lp in g.layers] == [b.data_ptr() for b in e.buffers]
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
