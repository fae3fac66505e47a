"""Source-only checks of the SGLang adapter package (no SGLang installed here)."""

from __future__ import annotations

import json

import pytest
from orbitkv_testing import assert_imports_nothing_heavy


def test_importing_the_sglang_adapter_imports_nothing_heavy() -> None:
    """O4: neither SGLang, vLLM, torch nor the native module is imported by the package or
    its settings parser (SGLang's plugin loader imports the entry point's module first)."""
    code = "import sys, orbitkv.sglang as s, orbitkv.sglang.plugin\n"
    code += "s.parse_settings({'orbitkv.socket_path': '/x.sock'})\n"
    heavy = ("sglang", "torch", "numpy", "vllm", "orbitkv._native", "orbitkv.kvcopy")
    heavy += ("orbitkv.sglang._shared", "orbitkv.sglang.v0_5_21", "orbitkv.sglang.v0_5_23")
    assert_imports_nothing_heavy(code, heavy)


def test_settings_defaults_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from orbitkv.sglang import OrbitKVSGLangConfigError, parse_settings

    monkeypatch.delenv("ORBITKV_SGLANG_CONFIG", raising=False)
    s = parse_settings()
    assert (s.socket_path, s.token, s.timeout_ms, s.model_identity) == (None, None, 250, None)
    monkeypatch.setenv("ORBITKV_SGLANG_CONFIG", json.dumps({"orbitkv.token": "t", "orbitkv.model_identity": "m@1"}))
    s = parse_settings()
    assert (s.token, s.model_identity) == ("t", "m@1")
    for bad, msg in (
        ({"socket_path": "/x"}, "unknown OrbitKV SGLang setting 'socket_path'"),
        ({"orbitkv.timeout_ms": True}, "timeout_ms must be an integer"),
        ({"orbitkv.token": ""}, "token must be a non-empty string"),
        ([1], "must be a JSON object"),
    ):
        with pytest.raises(OrbitKVSGLangConfigError) as info:
            parse_settings(json.dumps(bad))
        assert msg in str(info.value)


def test_the_backend_refuses_an_unqualified_sglang_release(monkeypatch: pytest.MonkeyPatch) -> None:
    from orbitkv.sglang import plugin

    monkeypatch.setattr(plugin, "version", lambda name: "0.5.22")
    with pytest.raises(
        plugin.UnsupportedSGLangVersion,
        match=r"orbitkv: .* qualified for sglang 0\.5\.21 and 0\.5\.23 only, found sglang 0\.5\.22",
    ):
        plugin.orbitkv_factory(object())


def test_each_qualified_release_has_its_own_module() -> None:
    """One module per release, never a fallback: 0.5.21 and 0.5.23 map to their own files."""
    from orbitkv.sglang import QUALIFIED_SGLANG, plugin

    assert QUALIFIED_SGLANG == ("0.5.21", "0.5.23")
    assert plugin.release_module("0.5.21") == "orbitkv.sglang.v0_5_21"
    assert plugin.release_module("0.5.23") == "orbitkv.sglang.v0_5_23"
    for unknown in ("0.5.22", "0.5.24", "0.6.0"):
        with pytest.raises(plugin.UnsupportedSGLangVersion, match=f"found sglang {unknown}"):
            plugin.release_module(unknown)
