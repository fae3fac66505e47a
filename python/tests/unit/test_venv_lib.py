"""scripts/venv-lib.sh: cached engine venvs removed, least recently used first, only when
the disk cannot hold the next one, and nothing but stamped OrbitKV venvs ever touched.

Runs on a real, small tmpfs (root only: mounting needs it), so `df` reports what the
files really take.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOM = Path(__file__).resolve().parents[3] / "scripts" / "venv-lib.sh"
MIB = 1024


@pytest.fixture
def small_fs() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting the 64 MiB tmpfs these tests run on needs root")
    mnt = Path(tempfile.mkdtemp(prefix="orbitkv-venv-room-"))
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        mnt.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
        mnt.rmdir()


def fake_venv(root: Path, name: str, mib: int, used: int | None, stamp: bool = True) -> Path:
    d = root / name
    d.mkdir()
    (d / "pyvenv.cfg").write_text("home = /usr/bin\n")
    if stamp:
        (d / ".orbitkv-vllm-stamp").write_text("vllm==0 pytest ruff\n")
    (d / "payload").write_bytes(b"\1" * (mib * 1024 * 1024))
    if used is not None:
        (d / ".orbitkv-used").touch()
        os.utime(d / ".orbitkv-used", (used, used))
    return d


def make_room(root: Path, need_kib: int, keep: Path, **env: str) -> subprocess.CompletedProcess[str]:
    script = f'source "{ROOM}"; make_venv_room "$1" "$2" "$3"'
    return subprocess.run(
        ["bash", "-c", script, "room", str(root), str(need_kib), str(keep)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )


def test_nothing_removed_while_the_disk_holds_the_next_venv(small_fs: Path) -> None:
    a = fake_venv(small_fs, "vllm-0.31.0", 10, used=100)
    r = make_room(small_fs, 40 * MIB, small_fs / "vllm-0.33.0")
    assert r.returncode == 0, r.stderr
    assert a.exists() and r.stderr == ""


def test_least_recently_used_venvs_go_first_and_only_as_many_as_needed(small_fs: Path) -> None:
    old = fake_venv(small_fs, "vllm-0.31.0", 16, used=100)
    mid = fake_venv(small_fs, "sglang-0.5.21", 16, used=200)
    new = fake_venv(small_fs, "vllm-0.34.0", 16, used=300)
    # 64 - 48 = 16 MiB free; 40 MiB needed: the two oldest go, the newest stays.
    r = make_room(small_fs, 40 * MIB, small_fs / "vllm-0.33.0")
    assert r.returncode == 0, r.stderr
    assert not old.exists() and not mid.exists() and new.exists()
    assert r.stderr.count("removing the cached venv") == 2
    assert str(old) in r.stderr.splitlines()[0]


def test_the_venv_being_built_unstamped_dirs_and_plain_files_are_never_removed(small_fs: Path) -> None:
    keep = fake_venv(small_fs, "vllm-0.33.0", 12, used=1)
    mine = fake_venv(small_fs, "my-own-venv", 12, used=2, stamp=False)
    (small_fs / "notes.bin").write_bytes(b"\0" * (12 * 1024 * 1024))
    r = make_room(small_fs, 60 * MIB, keep)
    assert r.returncode == 1
    assert keep.exists() and mine.exists() and (small_fs / "notes.bin").exists()
    assert "removing" not in r.stderr


def test_keep_venvs_removes_nothing_and_says_why(small_fs: Path) -> None:
    a = fake_venv(small_fs, "vllm-0.31.0", 40, used=100)
    r = make_room(small_fs, 40 * MIB, small_fs / "vllm-0.33.0", ORBITKV_KEEP_VENVS="1")
    assert r.returncode == 1
    assert a.exists()
    assert "ORBITKV_KEEP_VENVS=1" in r.stderr


def test_a_venv_never_marked_used_counts_as_oldest_by_its_creation(small_fs: Path) -> None:
    unmarked = fake_venv(small_fs, "sglang-0.5.23", 20, used=None)
    os.utime(unmarked / "pyvenv.cfg", (50, 50))
    marked = fake_venv(small_fs, "vllm-0.31.0", 20, used=100)
    r = make_room(small_fs, 30 * MIB, small_fs / "vllm-0.33.0")
    assert r.returncode == 0, r.stderr
    assert not unmarked.exists() and marked.exists()


def test_platform_check_names_a_missing_interpreter() -> None:
    script = f'fail() {{ echo "FAIL: $*"; exit 2; }}; source "{ROOM}"; check_venv_platform "vllm==0.31.0"; echo passed'
    r = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env={**os.environ, "PYTHON": "no-such-python3"}
    )
    assert r.returncode == 2 and "FAIL: no 'no-such-python3' interpreter on PATH" in r.stdout
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={**os.environ, "PYTHON": "python3"})
    assert r.returncode == 0 and r.stdout.strip().endswith("passed"), r.stdout


def start_build(venv: Path, need_gib: int) -> subprocess.CompletedProcess[str]:
    script = f'fail() {{ echo "FAIL: $*"; exit 2; }}; source "{ROOM}"; start_venv_build "$1" "$2" go; echo started'
    return subprocess.run(
        ["bash", "-c", script, "build", str(venv), str(need_gib)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": "python3"},
    )


def test_a_build_replaces_an_old_venv_and_refuses_anything_else(tmp_path: Path) -> None:
    old = fake_venv(tmp_path, "vllm-0.31.0", 1, used=None)
    r = start_build(old, 0)
    assert r.returncode == 0 and r.stdout.strip().endswith("started"), r.stdout + r.stderr
    assert r.stderr.strip() == "go"
    assert not (old / "payload").exists() and (old / "bin" / "python").exists()

    other = tmp_path / "not-a-venv"
    other.mkdir()
    (other / "data").write_text("keep")
    r = start_build(other, 0)
    assert r.returncode == 2 and "exists and is not a virtual environment; refusing to replace it" in r.stdout
    assert (other / "data").read_text() == "keep"


def test_a_build_without_room_names_the_shortfall(small_fs: Path) -> None:
    r = start_build(small_fs / "vllm-0.34.0", 1)
    assert r.returncode == 2 and "needs 1 GiB free under" in r.stdout and "MiB free" in r.stdout, r.stdout
    assert not (small_fs / "vllm-0.34.0").exists()
