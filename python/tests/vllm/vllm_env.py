"""Environment of the OrbitKV vLLM adapter suite (runs inside one pinned vLLM venv).

Run it with `python/tests/vllm/run.sh` (for each qualified pin: creates/reuses the venv,
installs the native wheel, runs pytest with -rs; ORBITKV_VLLM_PIN names the pin). When a
venv cannot be built, run.sh exports ORBITKV_VLLM_UNAVAILABLE with the reason and every
test here is skipped with it.
"""

from __future__ import annotations

import os
import sys
from importlib import metadata
from pathlib import Path

# The helpers shared with the other engine suite live in python/tests/support (put on the
# path here too: rank and engine subprocesses import this module outside pytest).
_SUPPORT = str(Path(__file__).resolve().parents[1] / "support")
if _SUPPORT not in sys.path:
    sys.path.append(_SUPPORT)
import engine_env  # noqa: E402
from engine_env import ManagerProcess, adapter_from_working_tree, skip_module  # noqa: E402,F401


def _installed_vllm() -> str | None:
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


INSTALLED_VLLM = _installed_vllm()
# vLLM reads these at platform detection; they must be set before it is imported.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if INSTALLED_VLLM in ("0.31.0", "0.33.0"):
    # The adapter is qualified on the V1 runner there; 0.34.0 has only V2 and refuses 0.
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

QUALIFIED_PINS = ("0.31.0", "0.33.0", "0.34.0")  # orbitkv.vllm.compat.SUPPORTED_PINS
# The pin this run tests (run.sh sets it); unset: whichever qualified pin is installed.
PINNED_VLLM = os.environ.get("ORBITKV_VLLM_PIN") or "/".join(QUALIFIED_PINS)
REPO_PYTHON = Path(__file__).resolve().parents[2]


def _not_the_pin() -> str | None:
    """Why this interpreter does not have the pinned vLLM, or None."""
    try:
        import vllm
    except Exception as exc:
        return (
            f"vllm=={PINNED_VLLM} is not importable from {sys.executable} ({exc!r}); "
            "run python/tests/vllm/run.sh, which builds the pinned venv"
        )
    version = getattr(vllm, "__version__", None)
    if version is None:  # e.g. only this test directory, seen as a namespace package
        return engine_env.not_installed("vllm", PINNED_VLLM)
    if version not in PINNED_VLLM.split("/"):
        return f"found vllm {version}, this run is pinned to {PINNED_VLLM}"
    return None


UNAVAILABLE = engine_env.venv_unavailable("vllm", PINNED_VLLM) or _not_the_pin()

if UNAVAILABLE is None and INSTALLED_VLLM == "0.34.0":
    # vLLM 0.34 refuses to build a CPU config on x86 without Triton for CPUs ("vLLM on x86
    # CPUs requires Triton (triton-cpu)", `CpuPlatform.check_and_update_config`): its x86 CPU
    # model runner needs it, and triton-cpu is not published on PyPI. This suite runs no
    # model - only vLLM's Scheduler, its KV-cache manager and the connector, with a harness
    # writing the pages - so it declares Triton present for that check (read lazily from
    # `vllm.triton_utils` when a config is built). Nothing here executes a Triton kernel.
    import vllm.triton_utils

    vllm.triton_utils.HAS_TRITON = True


def skip_module_if_unavailable() -> None:
    """Call first in every test module, before anything imports vLLM."""
    skip_module(UNAVAILABLE)


adapter_from_working_tree("vllm")
