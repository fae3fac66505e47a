"""The model-runner setting each vLLM pin needs, for the GPU engine processes.

vLLM 0.31.0 and 0.33.0 have two model runners and OrbitKV is qualified on V1 there
(`VLLM_USE_V2_MODEL_RUNNER=0`); 0.34.0 has only V2 and refuses that setting.
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version

V1_RUNNER_PINS = ("0.31.0", "0.33.0")


def set_runner_env(env: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Ask for the V1 runner where the installed vLLM has it (never overriding a setting)."""
    try:
        installed = version("vllm")
    except PackageNotFoundError:
        return
    if installed in V1_RUNNER_PINS:
        env.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
