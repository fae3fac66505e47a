"""The `orbitkv` command line against real processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from orbitkv_testing import eventually

pytestmark = pytest.mark.native


def orbitkv(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orbitkv", *args], capture_output=True, text=True, timeout=timeout)


def test_serve_rejects_bad_settings_clearly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    sock = str(tmp_path / "s.sock")
    r = orbitkv("serve", "--socket", sock, "--dram-size", "lots")
    assert r.returncode == 2 and 'invalid size "lots"' in r.stderr
    r = orbitkv("serve", "--socket", sock, "--metrics-addr", "0.0.0.0:9999")
    assert r.returncode == 2 and "not loopback" in r.stderr
    cfg = tmp_path / "m.toml"
    cfg.write_text('dram_size = "8MiB"\nunknown_key = 1\n')
    r = orbitkv("serve", "--socket", sock, "--config", str(cfg))
    assert r.returncode == 2 and "unknown_key" in r.stderr
    r = orbitkv("serve", "--help")
    assert r.returncode == 0 and "--dram-size" in r.stdout


def _address_space_cap() -> None:
    """Child side: at most 8 GiB of address space, so that a Manager that tried to create
    the arena anyway fails its mmap instead of meeting the OOM killer on the test host."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))


def test_serve_refuses_an_arena_larger_than_the_machine_before_creating_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The arena is written in full at start-up: one larger than MemTotal would end in the
    OOM killer (which may pick an engine on the host), so it is refused with both sizes."""
    r = subprocess.run(
        [sys.executable, "-m", "orbitkv", "serve", "--socket", str(tmp_path / "s.sock"), "--dram-size", "64TiB"],
        capture_output=True, text=True, timeout=60, preexec_fn=_address_space_cap,
    )  # fmt: skip
    assert r.returncode != 0, r.stderr
    assert "--dram-size 70368744177664 bytes (65536.0 GiB) is more than this machine's memory" in r.stderr, r.stderr
    assert "MemTotal" in r.stderr and "lower --dram-size" in r.stderr, r.stderr
    assert not (tmp_path / "s.sock").exists()


def _child_memory_cgroup(limit: int) -> tuple[Path, Path]:
    """A new memory cgroup below this process's own, limited to `limit` bytes: (the
    directory, its limit file). Skips where this host does not let us make one."""
    import os

    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            parent, limit_name = Path("/sys/fs/cgroup") / path.lstrip("/"), "memory.max"
        elif "memory" in controllers.split(","):
            parent, limit_name = Path("/sys/fs/cgroup/memory") / path.lstrip("/"), "memory.limit_in_bytes"
        else:
            continue
        child = parent / f"okv-test-{os.getpid()}"
        try:
            child.mkdir()
        except OSError as e:
            pytest.skip(f"cannot create a memory cgroup under {parent}: {e}")
        try:
            (child / limit_name).write_text(str(limit))
        except OSError as e:
            child.rmdir()
            pytest.skip(f"cannot limit a memory cgroup under {parent} ({limit_name}): {e}")
        return child, child / limit_name
    pytest.skip("no memory cgroup in /proc/self/cgroup")


def test_serve_refuses_an_arena_over_its_cgroup_memory_limit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A container's memory limit (a real cgroup made for the test) bounds the arena the
    same way: refused, naming the cgroup's limit file, before anything is created."""
    child, limit_file = _child_memory_cgroup(1 << 30)

    def enter() -> None:
        _address_space_cap()
        (child / "cgroup.procs").write_text("0")  # this (child) process

    try:
        r = subprocess.run(
            [sys.executable, "-m", "orbitkv", "serve", "--socket", str(tmp_path / "s.sock"), "--dram-size", "2GiB"],
            capture_output=True, text=True, timeout=60, preexec_fn=enter,
        )  # fmt: skip
    finally:
        child.rmdir()  # empty again: the Manager exited
    assert r.returncode != 0, r.stderr
    assert "is more than the memory limit of this process's cgroup (1073741824 bytes" in r.stderr, r.stderr
    assert str(limit_file) in r.stderr and "lower --dram-size or raise the limit" in r.stderr, r.stderr


def test_serve_status_and_sigterm(tmp_path) -> None:  # type: ignore[no-untyped-def]
    sock = tmp_path / "s.sock"
    cfg = tmp_path / "m.toml"
    cfg.write_text('dram_size = "8MiB"\nsegment_size = "4MiB"\nmetrics_addr = "127.0.0.1:0"\n')
    p = subprocess.Popen([sys.executable, "-m", "orbitkv", "serve", "--socket", str(sock), "--config", str(cfg)])
    try:
        eventually(lambda: orbitkv("status", "--socket", str(sock)).returncode == 0, "manager up")
        r = orbitkv("status", "--socket", str(sock))
        assert "DRAM arena   0.0 MiB / 8.0 MiB used" in r.stdout
        assert "SSD tier     off" in r.stdout
        assert "2 segment(s) of 4 KiB pages" in r.stdout
        assert "hints        0 blocks kept (0.0 MiB of 6.4 MiB allowed)" in r.stdout
        r = orbitkv("status", "--socket", str(sock), "--json")
        st = json.loads(r.stdout)
        assert st["dram_capacity_bytes"] == 8 << 20 and st["metrics_addr"].startswith("127.0.0.1:")
        assert (sock.stat().st_mode & 0o777) == 0o600
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0
        assert not sock.exists()
    finally:
        if p.poll() is None:
            p.kill()
    r = orbitkv("status", "--socket", str(sock))
    assert r.returncode == 1 and "cannot connect" in r.stderr


def test_demo_runs_verifies_and_reports(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "demo.json"
    t0 = time.monotonic()
    r = orbitkv(
        "demo",
        "--clients",
        "2",
        "--conversations",
        "4",
        "--turns",
        "3",
        "--system-tokens",
        "512",
        "--block-kib",
        "64",
        "--dram-size",
        "64MiB",
        "--json",
        str(out),
        "--quiet",
    )
    assert r.returncode == 0, r.stderr
    assert "hit rate" in r.stdout and "GB/s" in r.stdout and "0 mismatched blocks" in r.stdout
    res = json.loads(out.read_text())
    assert res["clients"] == 2 and res["mismatched_blocks"] == 0 and not res["errors"]
    # 4 conversations share the system prompt and reuse earlier turns: hits must happen.
    assert 0.3 < res["hit_rate"] < 1.0
    assert res["bytes_restored"] == res["blocks_hit"] * 64 * 1024
    assert res["manager"]["live_leases"] == 0 and res["manager"]["live_saves"] == 0
    assert time.monotonic() - t0 < 120


def test_demo_with_an_ssd_tier_recomputes_hits_the_manager_cannot_serve(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The SSD admission bench's shape: a 192 MiB arena with an SSD tier and two
    clients. A hit whose SSD blocks find no unpinned DRAM to stage into fails with
    RestoreFailed (the lease released); the demo recomputes it as an engine does,
    counts it apart and never as a hit, and the run still ends verified."""
    out = tmp_path / "demo.json"
    r = orbitkv(
        "demo", "--clients", "2", "--dram-size", "192MiB", "--ssd-dir", str(tmp_path / "ssd"),
        "--ssd-capacity", "2GiB", "--json", str(out), "--quiet", timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["mismatched_blocks"] == 0 and not res["errors"], res["errors"]
    assert res["bytes_restored"] == res["blocks_hit"] * 256 * 1024
    assert res["manager"]["ssd_staged_blocks_total"] > 0
    assert res["manager"]["live_leases"] == 0 and res["manager"]["live_saves"] == 0
    if res["restores_failed"]:
        assert "restores failed" in r.stdout
