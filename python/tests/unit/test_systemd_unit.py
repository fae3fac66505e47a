"""deploy/systemd: the Manager's unit and its arena drop-in, checked by systemd itself.

`systemd-analyze verify` reads the unit (as the instance `orbitkv@root`, the drop-in
beside it) and names every unknown key, bad value or missing command; any message is a
failure. Every `ORBITKV_*` variable they set must be one `orbitkv serve` reads. Without
systemd-analyze the checks skip, unless ORBITKV_REQUIRE_SYSTEMD=1 (scripts/test.sh sets it
where systemd-analyze is installed).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
UNIT = ROOT / "deploy" / "systemd" / "orbitkv@.service"
DROP_IN = ROOT / "deploy" / "systemd" / "arena.conf"
ARGS_RS = ROOT / "crates" / "orbitkv-manager" / "src" / "config" / "args.rs"


def analyze() -> str:
    exe = shutil.which("systemd-analyze")
    if exe is None:
        if os.environ.get("ORBITKV_REQUIRE_SYSTEMD") == "1":
            pytest.fail("ORBITKV_REQUIRE_SYSTEMD=1 but systemd-analyze is not installed")
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    return exe


def instance(tmp_path: Path, unit_text: str, drop_in: str | None = None) -> Path:
    """The unit as instance `orbitkv@root` in `tmp_path`, its command an executable that
    exists here (verify checks it), with `drop_in` beside it."""
    unit = tmp_path / "orbitkv@root.service"
    unit.write_text(unit_text.replace("ExecStart=/usr/local/bin/orbitkv ", "ExecStart=/bin/true "))
    if drop_in is not None:
        d = tmp_path / "orbitkv@root.service.d"
        d.mkdir()
        (d / "arena.conf").write_text(drop_in)
    return unit


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([analyze(), "verify", str(unit)], capture_output=True, text=True, timeout=60)


def test_the_unit_and_its_drop_in_verify_without_a_message(tmp_path: Path) -> None:
    r = verify(instance(tmp_path, UNIT.read_text(), DROP_IN.read_text()))
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


def test_verify_names_a_misspelt_key_in_the_drop_in(tmp_path: Path) -> None:
    """The check above would see a mistake: a misspelt key is named."""
    bad = DROP_IN.read_text().replace("Environment=ORBITKV_DRAM_SIZE", "Enviroment=ORBITKV_DRAM_SIZE")
    r = verify(instance(tmp_path, UNIT.read_text(), bad))
    assert "Enviroment" in r.stdout + r.stderr


def test_the_unit_keeps_its_hardening_and_restart_policy() -> None:
    text = UNIT.read_text()
    for line in (
        "ExecStart=/usr/local/bin/orbitkv serve",
        "User=%i",
        "RuntimeDirectory=orbitkv-%i",
        "Environment=ORBITKV_SOCKET=/run/orbitkv-%i/manager.sock",
        "Restart=on-failure",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "CapabilityBoundingSet=",
        "UMask=0077",
    ):
        assert re.search(rf"^{re.escape(line)}$", text, re.M), f"{UNIT.name} lost {line!r}"


def test_every_variable_set_is_one_the_manager_reads() -> None:
    known = set(re.findall(r'env = "(ORBITKV_[A-Z_]+)"', ARGS_RS.read_text()))
    assert {"ORBITKV_SOCKET", "ORBITKV_DRAM_SIZE", "ORBITKV_CONFIG"} <= known
    for f in (UNIT, DROP_IN):
        for line in f.read_text().splitlines():
            m = re.match(r"^#?Environment=(ORBITKV_[A-Z_]+)=", line)
            if m:
                assert m.group(1) in known, f"{f.name}: {m.group(1)} is not read by orbitkv serve"
