"""Environment of the OrbitKV SGLang adapter suite (runs inside the pinned SGLang venv).

Run it with `python/tests/sglang/run.sh` (creates/reuses the venv, installs the native
wheel, runs pytest with -rs). When the venv cannot be built, run.sh exports
ORBITKV_SGLANG_UNAVAILABLE with the reason and every test here is skipped with it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The pin this run tests (run.sh runs the suite once per pin, in that pin's venv).
PINNED_SGLANG = os.environ.get("ORBITKV_SGLANG_PIN") or "0.5.21"
V0_5_23 = PINNED_SGLANG == "0.5.23"
# The per-release adapter module under test.
ADAPTER_MODULE = "orbitkv.sglang.v0_5_23" if V0_5_23 else "orbitkv.sglang.v0_5_21"
REPO_PYTHON = Path(__file__).resolve().parents[2]
REPO_PKG = REPO_PYTHON / "orbitkv"


def _unavailable_reason() -> str | None:
    reason = os.environ.get("ORBITKV_SGLANG_UNAVAILABLE")
    if reason:
        return f"sglang=={PINNED_SGLANG} venv unavailable on this platform: {reason}"
    try:
        found = version("sglang")
    except PackageNotFoundError:
        return (
            f"sglang=={PINNED_SGLANG} is not installed for {sys.executable}; "
            "run python/tests/sglang/run.sh, which builds the pinned venv"
        )
    if found != PINNED_SGLANG:
        return f"found sglang {found}, the adapter is pinned to {PINNED_SGLANG}"
    return None


UNAVAILABLE = _unavailable_reason()


def skip_module_if_unavailable() -> None:
    """Call first in every test module, before anything imports SGLang."""
    if UNAVAILABLE:
        pytest.skip(UNAVAILABLE, allow_module_level=True)


def _use_working_tree_adapter() -> None:
    """Test this checkout's `orbitkv.sglang` (and the pure-Python helpers it uses) whatever
    `orbitkv` wheel is installed; the compiled `_native` stays the installed one."""
    if str(REPO_PYTHON) not in sys.path:
        sys.path.append(str(REPO_PYTHON))
    import orbitkv

    for sub in ("sglang", "kvcopy"):
        pkg_dir = REPO_PKG / sub
        name = f"orbitkv.{sub}"
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]
        spec = importlib.util.spec_from_file_location(
            name, pkg_dir / "__init__.py", submodule_search_locations=[str(pkg_dir)]
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        setattr(orbitkv, sub, module)


_use_working_tree_adapter()


# The Manager process helper is shared with the other engine suite (python/tests/support,
# put on the path here too: rank and engine subprocesses import this module outside pytest).
_SUPPORT = str(Path(__file__).resolve().parents[1] / "support")
if _SUPPORT not in sys.path:
    sys.path.append(_SUPPORT)
from engine_manager import ManagerProcess  # noqa: E402,F401
