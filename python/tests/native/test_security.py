"""Local-attacker holes seen from Python: a client refuses a server of another
uid before sending its token; the Manager refuses an open socket directory and
an open token file; `orbitkv status --token-file` refuses an open token file.
Tests that act as another uid need root and are skipped otherwise."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_native = pytest.importorskip("orbitkv._native")

NOBODY = 65534
TOKEN = "a-very-secret-token-0123"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")


def _fork_as(uid: int, body: Callable[[], None]) -> int:
    """Run `body` in a forked child that runs as `uid` (no exec: the
    interpreter may live where `uid` cannot read). Returns the child's pid."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            body()
        except BaseException as e:  # report anything; never return into pytest
            print(f"child as uid {uid} failed: {e!r}", file=sys.stderr, flush=True)
            code = 1
        finally:
            os._exit(code)
    return pid


def _reap(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # already reaped


@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    """A 0700 directory owned by uid 65534 that it can reach (pytest's own
    temporary directories sit under a 0700 directory of root)."""
    top = Path(tempfile.mkdtemp(prefix="orbitkv-sec-"))
    try:
        top.chmod(0o711)
        d = top / "nobody"
        d.mkdir(mode=0o700)
        os.chown(d, NOBODY, NOBODY)
        yield d
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _wait(what: str, f: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if f():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@needs_root
def test_client_refuses_a_server_of_another_uid_and_sends_it_nothing(nobody_dir: Path) -> None:
    sock = nobody_dir / "fake.sock"
    r, w = os.pipe()

    def fake_server() -> None:
        """Listen as uid 65534 and report every byte a client sends."""
        os.close(r)
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(sock))
        s.listen(1)
        os.write(w, b"ready\n")
        s.settimeout(120)
        c, _ = s.accept()
        c.settimeout(120)
        got = b""
        while chunk := c.recv(65536):
            got += chunk
        os.write(w, b"got:" + got.hex().encode() + b"\n")

    pid = _fork_as(NOBODY, fake_server)
    os.close(w)
    try:
        with os.fdopen(r) as report:
            assert report.readline().strip() == "ready"
            with pytest.raises(_native.AuthError, match=r"runs as uid 65534.*nothing was sent.*\[untrusted_server\]"):
                _native.Client(str(sock), token=TOKEN, timeout_ms=3000)
            out = report.read()  # until the child exits: it saw the client hang up
    finally:
        _reap(pid)
    assert out.strip() == "got:", f"the fake server received bytes: {out!r}"
    assert TOKEN.encode().hex() not in out


@needs_root
def test_server_uid_and_env_trust_a_manager_of_another_uid(nobody_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = nobody_dir
    tok = d / "token"
    tok.write_text(TOKEN + "\n")
    tok.chmod(0o600)
    os.chown(tok, NOBODY, NOBODY)
    sock = d / "m.sock"
    argv = ["orbitkv serve", "--socket", str(sock), "--dram-size", "8MiB", "--metrics-addr", "off",
            "--log-level", "warn", "--token-file", str(tok), "--allow-uid", "0"]  # fmt: skip
    pid = _fork_as(NOBODY, lambda: sys.exit(_native.serve(argv)))
    try:
        monkeypatch.delenv("ORBITKV_SERVER_UID", raising=False)
        wrong = "a-very-wrong-token-98765"  # counted as a refusal, had it been sent

        def connect(**kw: object) -> Any:
            deadline = time.monotonic() + 30
            while True:  # until the Manager listens
                try:
                    return _native.Client(str(sock), **kw)
                except _native.ManagerUnavailable:
                    if time.monotonic() > deadline or os.waitpid(pid, os.WNOHANG) != (0, 0):
                        raise
                    time.sleep(0.05)

        with pytest.raises(_native.AuthError, match=r"\[untrusted_server\]"):
            connect(token=wrong)
        with pytest.raises(_native.AuthError, match=r"or the trusted uid 4242.*\[untrusted_server\]"):
            connect(token=wrong, server_uid=4242, map_arena=False)
        with connect(token=TOKEN, server_uid=NOBODY) as c:
            assert c.stats()["auth_refused_total"] == 0
        monkeypatch.setenv("ORBITKV_SERVER_UID", str(NOBODY))
        with connect(token=TOKEN, map_arena=False) as c:
            assert c.stats()["auth_refused_total"] == 0
        monkeypatch.setenv("ORBITKV_SERVER_UID", "nobody")
        with pytest.raises(ValueError, match=r"ORBITKV_SERVER_UID.*not a numeric uid"):
            connect(token=TOKEN)
    finally:
        _reap(pid)


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orbitkv", "serve", "--dram-size", "4MiB", "--metrics-addr", "off", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_manager_refuses_an_open_socket_directory_and_an_open_token_file(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    r = _serve("--socket", str(open_dir / "m.sock"))
    assert r.returncode == 1, r
    assert f"unsafe socket directory {open_dir}: it is writable by group or others (mode 0777)" in r.stderr
    assert f"chmod 700 {open_dir}" in r.stderr
    assert not (open_dir / "m.sock").exists()

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    tok = tmp_path / "token"
    tok.write_text(TOKEN + "\n")
    tok.chmod(0o640)
    r = _serve("--socket", str(private / "m.sock"), "--token-file", str(tok))
    assert r.returncode == 2, r
    assert f"token file {tok} is accessible by group/others (mode 0640)" in r.stderr
    assert f"chmod 600 {tok}" in r.stderr


def test_status_refuses_an_open_token_file(tmp_path: Path) -> None:
    tok = tmp_path / "token"
    tok.write_text(TOKEN + "\n")
    tok.chmod(0o644)
    r = subprocess.run(
        [sys.executable, "-m", "orbitkv", "status", "--socket", str(tmp_path / "absent.sock"),
         "--token-file", str(tok)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 1, r
    assert f"token file {tok} is accessible by group/others (mode 0644)" in r.stderr
    assert f"chmod 600 {tok}" in r.stderr
