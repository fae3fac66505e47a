"""Every GPU test runs once per copy kernel of `orbitkv.kvcopy.CopyEngine`: the engines
a test builds with the default `kernel="auto"` take the kernel from
$ORBITKV_COPY_KERNEL, set here (subprocesses the test starts inherit it). A kernel that
cannot run on this host fails the test (an explicit choice is never replaced)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, params=["torch", "triton", "dma"])
def copy_kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("ORBITKV_COPY_KERNEL", request.param)
    return str(request.param)
