"""A Manager and its clients in different pid namespaces (containers that do not share
one): the Manager cannot watch a client it cannot see, so it refuses it with the fix;
a client that cannot see its Manager works (it only needs the Manager's uid)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

_native = pytest.importorskip("orbitkv._native")

pytestmark = [
    pytest.mark.native,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("unshare") is None, reason="new pid namespaces need root and unshare"
    ),
]

CLIENT = """
import os, sys
from orbitkv import _native
with _native.Client(sys.argv[1]) as c:
    ns = c.register_namespace(b"p" * 32, 4096)
    hashes = [os.urandom(32) for _ in range(4)]
    data = os.urandom(4 * 4096)
    assert c.save(ns, hashes, data).stored == 4
    with c.lookup(ns, hashes) as lease:
        out = bytearray(4 * 4096)
        c.restore(lease, out)
    assert out == data and lease.hit_blocks == 4
print("restored", os.getpid())
"""


def serve(sock: Path, *prefix: str) -> subprocess.Popen[bytes]:
    cmd = [*prefix, sys.executable, "-m", "orbitkv", "serve", "--socket", str(sock), "--dram-size", "16MiB"]
    p = subprocess.Popen([*cmd, "--metrics-addr", "off"], stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 20
    while not sock.exists():
        assert p.poll() is None and time.monotonic() < deadline, "the Manager did not start"
        time.sleep(0.05)
    return p


def stop(p: subprocess.Popen[bytes]) -> str:
    os.killpg(p.pid, signal.SIGTERM)  # the Manager too, not only `unshare` (which ignores it)
    _, err = p.communicate(timeout=20)
    return err.decode(errors="replace")


def test_a_manager_that_cannot_see_the_client_refuses_it_with_the_fix(tmp_path: Path) -> None:
    sock = tmp_path / "run" / "m.sock"
    p = serve(sock, "unshare", "--pid", "--fork", "--mount-proc")
    try:
        with pytest.raises(_native.AuthError) as e:
            _native.Client(str(sock))
        msg = str(e.value)
        assert "not visible in the Manager's pid namespace" in msg
        assert "shareProcessNamespace: true" in msg and "--pid container:<manager>" in msg
    finally:
        err = stop(p)
    assert "refusing connection: the client's process (uid" in err


def test_a_client_that_cannot_see_the_manager_is_served(tmp_path: Path) -> None:
    sock = tmp_path / "run" / "m.sock"
    p = serve(sock)
    try:
        r = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", CLIENT, str(sock)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["restored", "1"]  # pid 1 of its own namespace
    finally:
        stop(p)
