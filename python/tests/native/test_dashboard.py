"""deploy/grafana/orbitkv.json queries only metrics a live Manager exposes.

The dashboard's `orbitkv_*` series come from the Manager's `/metrics`; its
`vllm:orbitkv_*` series come from vLLM's Prometheus endpoint and are checked against
the released vLLM in python/tests/vllm/test_defaults.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from orbitkv_testing import eventually

pytestmark = pytest.mark.native

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "orbitkv.json"
_METRIC = re.compile(r"(?<![\w:])((?:vllm:)?orbitkv_[a-z0-9_]+)")


def dashboard_metrics() -> tuple[set[str], set[str]]:
    """(Manager metric names, vLLM connector metric names) queried by the panels."""
    dash = json.loads(DASHBOARD.read_text())
    manager: set[str] = set()
    vllm: set[str] = set()
    for panel in dash["panels"]:
        assert panel["targets"], f"panel {panel['title']!r} queries nothing"
        for target in panel["targets"]:
            names = _METRIC.findall(target["expr"])
            assert names, f"panel {panel['title']!r}: no OrbitKV metric in {target['expr']!r}"
            for name in names:
                (vllm if name.startswith("vllm:") else manager).add(name)
    return manager, vllm


def exposed(text: str) -> set[str]:
    return {line.split()[0].split("{")[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_every_manager_metric_a_panel_queries_is_exposed(tmp_path: Path) -> None:
    manager, vllm = dashboard_metrics()
    assert len(manager) >= 30 and len(vllm) >= 10  # the dashboard covers both sides
    sock = tmp_path / "m.sock"
    cfg = tmp_path / "m.toml"
    cfg.write_text('dram_size = "8MiB"\nsegment_size = "4MiB"\nmetrics_addr = "127.0.0.1:0"\n')
    p = subprocess.Popen([sys.executable, "-m", "orbitkv", "serve", "--socket", str(sock), "--config", str(cfg)])
    try:

        def status() -> dict[str, object] | None:
            r = subprocess.run(
                [sys.executable, "-m", "orbitkv", "status", "--socket", str(sock), "--json"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            return json.loads(r.stdout) if r.returncode == 0 else None

        eventually(lambda: status() is not None, "manager up")
        st = status()
        assert st is not None
        addr = st["metrics_addr"]
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        have = exposed(text)
        missing = sorted(manager - have)
        assert not missing, f"the dashboard queries metrics the Manager does not expose: {missing}"
    finally:
        p.terminate()
        p.wait(timeout=20)
