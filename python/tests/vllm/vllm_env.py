"""Environment of the OrbitKV vLLM adapter suite (runs inside one pinned vLLM venv).

Run it with `python/tests/vllm/run.sh` (for each qualified pin: creates/reuses the venv,
installs the native wheel, runs pytest with -rs; ORBITKV_VLLM_PIN names the pin). When a
venv cannot be built, run.sh exports ORBITKV_VLLM_UNAVAILABLE with the reason and every
test here is skipped with it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

# vLLM reads these at platform detection; they must be set before it is imported.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

QUALIFIED_PINS = ("0.31.0", "0.33.0")  # orbitkv.vllm.compat.SUPPORTED_PINS
# The pin this run tests (run.sh sets it); unset: whichever qualified pin is installed.
PINNED_VLLM = os.environ.get("ORBITKV_VLLM_PIN") or "/".join(QUALIFIED_PINS)
REPO_PYTHON = Path(__file__).resolve().parents[2]
REPO_PKG = REPO_PYTHON / "orbitkv"


def _unavailable_reason() -> str | None:
    reason = os.environ.get("ORBITKV_VLLM_UNAVAILABLE")
    if reason:
        return f"vllm=={PINNED_VLLM} venv unavailable on this platform: {reason}"
    try:
        import vllm
    except Exception as exc:
        return (
            f"vllm=={PINNED_VLLM} is not importable from {sys.executable} ({exc!r}); "
            "run python/tests/vllm/run.sh, which builds the pinned venv"
        )
    version = getattr(vllm, "__version__", None)
    if version is None:  # e.g. only this test directory, seen as a namespace package
        return (
            f"vllm=={PINNED_VLLM} is not installed for {sys.executable}; "
            "run python/tests/vllm/run.sh, which builds the pinned venv"
        )
    if version not in PINNED_VLLM.split("/"):
        return f"found vllm {version}, this run is pinned to {PINNED_VLLM}"
    return None


UNAVAILABLE = _unavailable_reason()


def skip_module_if_unavailable() -> None:
    """Call first in every test module, before anything imports vLLM."""
    if UNAVAILABLE:
        pytest.skip(UNAVAILABLE, allow_module_level=True)


def _use_working_tree_adapter() -> None:
    """Test this checkout's `orbitkv.vllm`, whatever `orbitkv` package is installed.

    The installed wheel may carry an older copy of `orbitkv/vllm`. Load the working
    tree's `orbitkv.vllm` package explicitly (its submodules then resolve here too);
    the rest of `orbitkv`, including the compiled `_native`, stays the installed one.
    """
    if str(REPO_PYTHON) not in sys.path:
        sys.path.append(str(REPO_PYTHON))
    import orbitkv

    pkg_dir = REPO_PKG / "vllm"
    for name in [m for m in sys.modules if m == "orbitkv.vllm" or m.startswith("orbitkv.vllm.")]:
        del sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        "orbitkv.vllm", pkg_dir / "__init__.py", submodule_search_locations=[str(pkg_dir)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["orbitkv.vllm"] = module
    spec.loader.exec_module(module)
    orbitkv.vllm = module  # type: ignore[attr-defined]


_use_working_tree_adapter()


# The Manager process helper is shared with the other engine suite (python/tests/support,
# put on the path here too: rank and engine subprocesses import this module outside pytest).
_SUPPORT = str(Path(__file__).resolve().parents[1] / "support")
if _SUPPORT not in sys.path:
    sys.path.append(_SUPPORT)
from engine_manager import ManagerProcess  # noqa: E402,F401
