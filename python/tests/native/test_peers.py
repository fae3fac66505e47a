"""Peer Managers through `orbitkv serve` processes: a block saved on A is restored
byte-exact through B, and `orbitkv status` / `/metrics` show the peer and its traffic."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request

import pytest
from orbitkv_testing import eventually

from orbitkv import _native
from orbitkv.hashing import chain_hashes, chain_root, fingerprint

pytestmark = pytest.mark.native

BB = 32 * 1024
FP = fingerprint(model="peer-test", block_bytes=BB)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def orbitkv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orbitkv", *args], capture_output=True, text=True, timeout=60)


def serve(sock: str, *args: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "orbitkv", "serve", "--socket", sock, "--dram-size", "16MiB", "--log-level", "warn"]
    return subprocess.Popen([*cmd, *args])


def test_restore_through_a_peer_and_status_shows_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pa, metrics = free_port(), free_port()
    sa, sb = str(tmp_path / "a.sock"), str(tmp_path / "b.sock")
    a = serve(sa, "--metrics-addr", "off", "--peer-listen", f"127.0.0.1:{pa}")
    b = serve(sb, "--metrics-addr", f"127.0.0.1:{metrics}", "--peer", f"127.0.0.1:{pa}")
    try:
        for s in (sa, sb):
            eventually(lambda s=s: orbitkv("status", "--socket", s).returncode == 0, "manager up")
        hashes = chain_hashes(list(range(16 * 4)), 16, chain_root(FP))
        data = [bytes([i + 1]) * BB for i in range(4)]
        with _native.Client(sa) as c:
            ns = c.register_namespace(FP, BB)
            assert c.save(ns, hashes, data).stored == 4
        with _native.Client(sb) as c:
            ns = c.register_namespace(FP, BB)
            out = [bytearray(BB) for _ in range(4)]
            with c.lookup(ns, hashes) as lease:
                assert lease.hit_blocks == 4
                c.restore(lease, out)
            assert [bytes(o) for o in out] == data
        r = orbitkv("status", "--socket", sb)
        assert r.returncode == 0, r.stderr
        assert f"127.0.0.1:{pa}" in r.stdout and " up " in r.stdout, r.stdout
        assert "4 blocks / 131072 bytes in, 0 errors" in r.stdout, r.stdout
        r = orbitkv("status", "--socket", sa)
        assert "4 blocks sent, 0 leases open" in r.stdout, r.stdout
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10).read().decode()
        assert f'orbitkv_peer_blocks_total{{peer="127.0.0.1:{pa}"}} 4' in text
        assert f'orbitkv_peer_up{{peer="127.0.0.1:{pa}"}} 1' in text
    finally:
        for p in (a, b):
            p.terminate()
            p.wait(timeout=20)


def test_off_loopback_peers_need_tls(tmp_path) -> None:  # type: ignore[no-untyped-def]
    r = orbitkv("serve", "--socket", str(tmp_path / "s.sock"), "--peer-listen", "0.0.0.0:7470")
    assert r.returncode == 2 and "requires mutual TLS" in r.stderr
