"""`import orbitkv.kvcopy` is light: no torch, no native module, no vLLM (the GPU machine
and the scheduler process import it before deciding anything)."""

from __future__ import annotations

from orbitkv_testing import assert_imports_nothing_heavy


def test_importing_the_copy_engine_package_imports_nothing_heavy() -> None:
    code = "import sys, orbitkv.kvcopy as k\nassert issubclass(k.CopyEngineError, RuntimeError)\n"
    assert_imports_nothing_heavy(code, ("torch", "numpy", "vllm", "orbitkv._native"))


def test_unknown_names_are_attribute_errors() -> None:
    import orbitkv.kvcopy as k

    try:
        k.NoSuchThing  # noqa: B018
    except AttributeError as e:
        assert "NoSuchThing" in str(e)
    else:
        raise AssertionError("expected AttributeError")
