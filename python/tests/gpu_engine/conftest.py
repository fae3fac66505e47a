"""The GPU engine suite needs a CUDA device, the released vLLM (0.31.0, 0.33.0 or 0.34.0) importable and
the orbitkv wheel; without one of them every test is skipped with the reason."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _missing() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device visible to torch: the GPU engine suite runs on a GPU host"
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not importable (scripts/gpu-engine.sh installs it on a GPU host)"
    try:
        import orbitkv._native  # noqa: F401
    except ImportError:
        return "the orbitkv wheel is not installed"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _missing()
    if reason is None:
        return
    here = Path(__file__).resolve().parent
    for item in items:
        if Path(str(item.fspath)).resolve().parent == here:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def engine_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where every engine role writes its plan, log and JSON result."""
    d = os.environ.get("ORBITKV_GPU_ENGINE_OUT")
    return Path(d) if d else tmp_path_factory.mktemp("gpu-engine")


@pytest.fixture(scope="session")
def model_dir(engine_out: Path) -> Path:
    from gpu_suite import build_model

    return build_model(Path(os.environ.get("ORBITKV_GPU_ENGINE_MODEL", str(engine_out / "tiny-llama"))))


@pytest.fixture(scope="session")
def suite(model_dir: Path, engine_out: Path) -> Callable[[str], object]:
    """`suite(mode)`: every role of that mode, run once per session on first use."""
    from gpu_suite import run_mode

    runs: dict[str, object] = {}

    def get(mode: str) -> object:
        if mode not in runs:
            runs[mode] = run_mode(mode, model_dir, engine_out / mode)
        return runs[mode]

    return get
