"""`import orbitkv.kvcopy` is light: no torch, no native module, no vLLM (the GPU machine
and the scheduler process import it before deciding anything)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_copy_engine_package_imports_nothing_heavy() -> None:
    code = (
        "import sys, orbitkv.kvcopy as k\n"
        "assert issubclass(k.CopyEngineError, RuntimeError)\n"
        "heavy = [m for m in ('torch', 'numpy', 'vllm', 'orbitkv._native') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_unknown_names_are_attribute_errors() -> None:
    import orbitkv.kvcopy as k

    try:
        k.NoSuchThing  # noqa: B018
    except AttributeError as e:
        assert "NoSuchThing" in str(e)
    else:
        raise AssertionError("expected AttributeError")
