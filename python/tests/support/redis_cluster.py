"""A real Redis Cluster for one test (3 masters + 3 replicas on loopback, ACL on), from
`scripts/redis-cluster.sh`; stopped on exit. Without Debian's redis-server the test is
skipped with the reason, unless ORBITKV_REQUIRE_REDIS is set (scripts/test.sh sets it once
the server is installed): then it fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "redis-cluster.sh"


class RedisCluster:
    def __init__(self, directory: Path, base_port: int) -> None:
        self.dir = directory
        self.base_port = base_port

    def seeds(self) -> list[str]:
        return [f"127.0.0.1:{self.base_port + i}" for i in range(6)]

    def manager_args(self, deadline_ms: int = 1000) -> tuple[str, ...]:
        """`orbitkv serve` flags using this cluster as the remote tier."""
        return (
            "--remote-nodes",
            ",".join(self.seeds()),
            "--remote-password-file",
            str(self.dir / "password"),
            "--remote-deadline-ms",
            str(deadline_ms),
        )


@contextmanager
def redis_cluster(base_port: int) -> Iterator[RedisCluster]:
    """Nodes on `base_port`..+5, their cluster bus on +10000 (keep both under 32768)."""
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        if os.environ.get("ORBITKV_REQUIRE_REDIS"):
            pytest.fail("ORBITKV_REQUIRE_REDIS is set but redis-server / redis-cli are not installed")
        pytest.skip("redis-server is not installed (Debian: redis-server redis-tools)")
    d = Path(tempfile.mkdtemp(prefix="orbitkv-redis-"))
    try:
        r = subprocess.run(
            ["bash", str(SCRIPT), "start", str(d / "cluster"), str(base_port)], capture_output=True, text=True
        )
        if r.returncode != 0:
            raise RuntimeError(f"redis-cluster.sh start failed: {r.stderr[-2000:]}")
        yield RedisCluster(d / "cluster", base_port)
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", str(d / "cluster")], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)
