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


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With `ORBITKV_GPU_ENGINE_OUT` set, each test's verdict is appended to `verdicts.jsonl`
    there as soon as it is known: a run cut short (a device session's time running out)
    keeps the verdicts of the tests that finished, which pytest prints only at the end."""
    d = os.environ.get("ORBITKV_GPU_ENGINE_OUT")
    here = Path(__file__).resolve().parent
    if not d or not (here / Path(report.nodeid.split("::")[0]).name).is_file():
        return
    if report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
        return
    import json

    Path(d).mkdir(parents=True, exist_ok=True)
    line = {"test": report.nodeid, "when": report.when, "outcome": report.outcome, "seconds": report.duration}
    if report.outcome == "failed":
        line["error"] = str(report.longrepr)[-2000:]
    with open(Path(d) / "verdicts.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


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
