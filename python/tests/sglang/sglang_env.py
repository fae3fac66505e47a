"""Environment of the OrbitKV SGLang adapter suite (runs inside the pinned SGLang venv).

Run it with `python/tests/sglang/run.sh` (creates/reuses the venv, installs the native
wheel, runs pytest with -rs). When the venv cannot be built, run.sh exports
ORBITKV_SGLANG_UNAVAILABLE with the reason and every test here is skipped with it.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

# The helpers shared with the other engine suite live in python/tests/support (put on the
# path here too: rank and engine subprocesses import this module outside pytest).
_SUPPORT = str(Path(__file__).resolve().parents[1] / "support")
if _SUPPORT not in sys.path:
    sys.path.append(_SUPPORT)
import engine_env  # noqa: E402
from engine_env import ManagerProcess, adapter_from_working_tree, skip_module  # noqa: E402,F401

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The pin this run tests (run.sh runs the suite once per pin, in that pin's venv).
PINNED_SGLANG = os.environ.get("ORBITKV_SGLANG_PIN") or "0.5.21"
V0_5_23 = PINNED_SGLANG == "0.5.23"
# The per-release adapter module under test.
ADAPTER_MODULE = "orbitkv.sglang.v0_5_23" if V0_5_23 else "orbitkv.sglang.v0_5_21"
REPO_PYTHON = Path(__file__).resolve().parents[2]


def _not_the_pin() -> str | None:
    """Why this interpreter does not have the pinned SGLang, or None."""
    try:
        found = version("sglang")
    except PackageNotFoundError:
        return engine_env.not_installed("sglang", PINNED_SGLANG)
    if found != PINNED_SGLANG:
        return f"found sglang {found}, the adapter is pinned to {PINNED_SGLANG}"
    return None


UNAVAILABLE = engine_env.venv_unavailable("sglang", PINNED_SGLANG) or _not_the_pin()


def skip_module_if_unavailable() -> None:
    """Call first in every test module, before anything imports SGLang."""
    skip_module(UNAVAILABLE)


adapter_from_working_tree("sglang")
