"""`orbitkv qualify` against real Managers, real files and this host's real limits."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orbitkv.qualify import fs_type

pytestmark = pytest.mark.native

NAMES = ["socket_dir", "memlock", "hugepages", "ssd_direct_io", "manager", "arena_copy", "gpu_pin", "copy_engine"]
SMALL = ["--dram-size", "64MiB", "--copy-bytes", "8MiB", "--block-size", "1MiB", "--ssd-bytes", "8MiB", "--reps", "1"]
SSD_CAPACITY = ["--ssd-capacity", "64MiB"]  # the tier's default (16 GiB) needs that much free disk


def qualify(*args: str, prefix: list[str] | None = None) -> tuple[int, dict[str, Any], str]:
    r = subprocess.run(
        [*(prefix or []), sys.executable, "-m", "orbitkv", "qualify", "--json", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    return r.returncode, doc, r.stderr


def by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    items = {i["name"]: i for i in doc["items"]}
    assert list(items) == NAMES
    for i in doc["items"]:
        assert i["verdict"] in ("ok", "warn", "fail", "skip") and i["found"]
        assert (i["fix"] is not None) == (i["verdict"] in ("warn", "fail")), i
    return items


def direct_io_dir(tmp_path: Path) -> Path:
    """A directory on a disk filesystem that takes O_DIRECT (tmp_path unless it is in memory)."""
    for d in (tmp_path, Path("/var/tmp")):
        if fs_type(d) in ("tmpfs", "ramfs"):
            continue
        probe = d / f".direct-probe-{os.getpid()}"
        try:
            os.close(os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o600))
            return d
        except OSError:
            continue
        finally:
            probe.unlink(missing_ok=True)
    pytest.skip("no directory here takes O_DIRECT")


def test_a_host_that_can_run_orbitkv_gets_its_figures(tmp_path: Path) -> None:
    ssd = direct_io_dir(tmp_path)
    private = tmp_path / "run"
    private.mkdir(mode=0o700)
    rc, doc, err = qualify(*SMALL, *SSD_CAPACITY, "--socket", str(private / "m.sock"), "--ssd-dir", str(ssd))
    items = by_name(doc)
    assert "starting a Manager: --dram-size 64MiB" in err
    assert items["socket_dir"]["verdict"] == "ok" and "mode 0700" in items["socket_dir"]["found"]
    assert items["manager"]["verdict"] == "ok", items["manager"]
    assert items["manager"]["data"]["arena_bytes"] == 64 << 20 and items["manager"]["data"]["segments"] >= 1
    assert items["manager"]["data"]["ssd"]["mode"] == "direct"
    copy = items["arena_copy"]
    assert copy["verdict"] in ("ok", "warn") and copy["data"]["bytes"] == 8 << 20
    for k in ("save_gbps", "restore_gbps", "memcpy_gbps"):
        assert copy["data"][k] > 0
    io = items["ssd_direct_io"]
    assert io["verdict"] in ("ok", "warn") and io["data"]["read_direct_gbps"] > 0 and io["data"]["read_plain_gbps"] > 0
    assert not list(ssd.glob(".orbitkv-qualify-*")), "the scratch file and SSD directory are removed"
    # torch is not in this venv: the GPU items say so and count as skipped, not failed
    for name in ("gpu_pin", "copy_engine"):
        assert items[name]["verdict"] == "skip" and "torch" in items[name]["found"]
    assert rc == 0 and doc["verdict"] in ("ok", "warn")


def test_an_unsafe_socket_directory_fails_with_the_managers_rule(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o770)
    rc, doc, _ = qualify(*SMALL, "--socket", str(shared / "m.sock"))
    item = by_name(doc)["socket_dir"]
    assert rc == 1 and doc["verdict"] == "fail"
    assert item["verdict"] == "fail" and "writable by group or others (mode 0770)" in item["found"]
    assert item["fix"] == f"chmod 700 {shared}"
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    _, doc, _ = qualify(*SMALL, "--socket", str(sticky / "m.sock"))
    assert "is a shared directory (mode 1777, like /tmp)" in by_name(doc)["socket_dir"]["found"]
    link = tmp_path / "link"
    link.symlink_to(shared)
    _, doc, _ = qualify(*SMALL, "--socket", str(link / "m.sock"))
    assert "symbolic link" in by_name(doc)["socket_dir"]["found"]


def test_a_manager_that_would_not_start_reports_its_own_refusal(tmp_path: Path) -> None:
    private = tmp_path / "run"
    rc, doc, _ = qualify(*SMALL, "--socket", str(private / "m.sock"), "--segment-size", "5000")
    items = by_name(doc)
    assert rc == 1 and items["manager"]["verdict"] == "fail"
    assert "--segment-size 5000 did not start" in items["manager"]["found"]
    assert "multiple of 4096" in items["manager"]["found"], items["manager"]["found"]
    for name in ("arena_copy", "gpu_pin", "copy_engine"):
        assert items[name]["verdict"] == "skip" and "did not start" in items[name]["found"]


def test_an_ssd_capacity_beyond_the_free_disk_fails_the_manager_item(tmp_path: Path) -> None:
    """The SSD tier's capacity is the Manager's (`--ssd-capacity`, as `orbitkv serve`): one
    that does not fit in the directory's free space is the tier's own refusal."""
    ssd = direct_io_dir(tmp_path)
    private = tmp_path / "run"
    too_big = ["--ssd-dir", str(ssd), "--ssd-capacity", "100000GiB"]
    rc, doc, _ = qualify(*SMALL, "--socket", str(private / "m.sock"), *too_big)
    manager = by_name(doc)["manager"]
    assert rc == 1 and manager["verdict"] == "fail"
    assert "--ssd-capacity 100000GiB" in manager["found"] and "does not fit" in manager["found"], manager["found"]


def test_too_few_huge_pages_fail_with_how_many_to_reserve(tmp_path: Path) -> None:
    free = int(Path("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages").read_text())
    need = free + 4
    rc, doc, _ = qualify(
        "--dram-size", f"{need * 2}MiB", "--hugepages", "2MiB", "--reps", "1", "--socket", str(tmp_path / "r" / "s")
    )
    items = by_name(doc)
    assert rc == 1
    hp = items["hugepages"]
    assert hp["verdict"] == "fail" and f"needs {need} free 2MiB pages, {free} are free" in hp["found"]
    assert "reserve 4 more" in hp["fix"] and "hugepages-2048kB/nr_hugepages" in hp["fix"]
    assert items["manager"]["verdict"] == "fail" and "free" in items["manager"]["found"]


def test_an_ssd_dir_in_memory_fails_the_ssd_item(tmp_path: Path) -> None:
    if fs_type(Path("/dev/shm")) != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    shm = Path(f"/dev/shm/orbitkv-qualify-test-{os.getpid()}")
    shm.mkdir()
    try:
        rc, doc, _ = qualify(*SMALL, "--socket", str(tmp_path / "r" / "s"), "--ssd-dir", str(shm))
    finally:
        shutil.rmtree(shm)
    items = by_name(doc)
    io = items["ssd_direct_io"]
    assert rc == 1 and io["verdict"] == "fail" and "is on tmpfs: memory, not an SSD" in io["found"]
    assert "local filesystem on the SSD" in io["fix"]
    # the Manager's SSD tier refuses the same directory at start-up, naming it
    assert items["manager"]["verdict"] == "fail" and "O_DIRECT" in items["manager"]["found"]


def test_a_memlock_limit_below_the_arena_is_reported_without_cap_ipc_lock(tmp_path: Path) -> None:
    if shutil.which("setpriv") is None or shutil.which("prlimit") is None:
        pytest.skip("setpriv and prlimit (util-linux) are needed to drop CAP_IPC_LOCK and lower the limit")
    prefix = ["setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", "prlimit", "--memlock=1048576"]
    _, doc, _ = qualify(*SMALL, "--socket", str(tmp_path / "r" / "s"), prefix=prefix)
    ml = by_name(doc)["memlock"]
    assert ml["data"]["soft"] == 1 << 20 and ml["data"]["cap_ipc_lock"] is False
    assert "RLIMIT_MEMLOCK 1.0 MiB is below the 64.0 MiB arena" in ml["found"]
    if Path("/proc/driver/nvidia/gpus").is_dir():
        assert ml["verdict"] == "warn" and "LimitMEMLOCK=infinity" in ml["fix"]
    else:
        assert ml["verdict"] == "ok" and "no GPU here" in ml["found"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dram-size", "lots"], "invalid size 'lots'"),
        (["--hugepages", "4MiB"], "--hugepages '4MiB' must be off, 2MiB or 1GiB"),
        (["--block-size", "1000"], "must be a positive multiple of 4 KiB"),
        (["--device", "tpu"], "--device 'tpu' must be auto, cpu, cuda or cuda:N"),
        (["--reps", "0"], "--reps 0 must be at least 1"),
        (["--ssd-capacity", "1GiB"], "--ssd-capacity needs --ssd-dir"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(args: list[str], message: str) -> None:
    r = subprocess.run([sys.executable, "-m", "orbitkv", "qualify", *args], capture_output=True, text=True)
    assert r.returncode == 2 and message in r.stderr and "starting a Manager" not in r.stderr


def test_enough_huge_pages_qualify_and_the_manager_runs_on_them(tmp_path: Path) -> None:
    free = int(Path("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages").read_text())
    if free < 4:
        pytest.skip(f"{free} free 2 MiB huge pages; 4 needed (scripts/test.sh reserves 8 as root)")
    rc, doc, _ = qualify(
        "--dram-size", "8MiB", "--hugepages", "2MiB", "--copy-bytes", "2MiB", "--block-size", "1MiB",
        "--reps", "1", "--socket", str(tmp_path / "r" / "s"),
    )  # fmt: skip
    assert rc == 0, doc
    items = by_name(doc)
    assert items["hugepages"]["verdict"] == "ok" and "cover the arena's 4" in items["hugepages"]["found"]
    assert items["manager"]["verdict"] == "ok" and items["manager"]["data"]["page_bytes"] == 2 << 20
    assert items["arena_copy"]["verdict"] in ("ok", "warn") and items["arena_copy"]["data"]["restore_gbps"] > 0
