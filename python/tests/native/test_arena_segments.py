"""An arena of many segments serves clients whose fd limit is far below the segment count.

The Manager passes the arena's fds in batches after the hello reply; a client
maps and closes each batch before the next, so 1,040 segments are served to a
process whose RLIMIT_NOFILE is 256 (byte-exact saves and restores in every
segment, leases, and the scheduler-only client that maps nothing).
"""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap

import pytest

from orbitkv.hashing import chain_hashes, chain_root, fingerprint

pytestmark = pytest.mark.native

SEG = 64 * 1024  # one block per segment: every segment must be mapped for the round trip
SEGMENTS = 1040
FP = fingerprint(model="many-segments", block_bytes=SEG)


def limited_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def run_limited(code: str, socket: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), socket],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limited_nofile,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_1040_segments_serve_clients_limited_to_256_fds(manager_factory) -> None:  # type: ignore[no-untyped-def]
    m = manager_factory("--dram-size", str(SEG * SEGMENTS), "--segment-size", str(SEG))
    stats = m.stats()
    assert stats["segment_sizes"] == [SEG] * SEGMENTS

    # A writer limited to 256 fds fills every segment (each block lands in one),
    # then a reader limited the same way restores every block byte-exact.
    hashes = chain_hashes(list(range(16 * SEGMENTS)), 16, chain_root(FP))
    writer = f"""
        import resource, sys
        from orbitkv import _native
        from orbitkv.hashing import chain_hashes, chain_root
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (256, 256)
        fp = bytes.fromhex("{FP.hex()}")
        hs = chain_hashes(list(range(16 * {SEGMENTS})), 16, chain_root(fp))
        with _native.Client(sys.argv[1]) as c:
            ns = c.register_namespace(fp, {SEG})
            r = c.save(ns, hs, [h * ({SEG} // 32) for h in hs])
            print(r.stored, r.already_present, r.refused)
        """
    assert run_limited(writer, m.socket).split() == [str(SEGMENTS), "0", "0"]

    reader = f"""
        import resource, sys
        import numpy as np
        from orbitkv import _native
        from orbitkv.hashing import chain_hashes, chain_root
        fp = bytes.fromhex("{FP.hex()}")
        hs = chain_hashes(list(range(16 * {SEGMENTS})), 16, chain_root(fp))
        with _native.Client(sys.argv[1]) as c:
            ns = c.register_namespace(fp, {SEG})
            lease = c.lookup(ns, hs)
            segs = {{seg for seg, _ in c.acquire(lease)}}
            dst = np.zeros({SEG} * len(hs), dtype=np.uint8)
            c.restore(lease, dst)
            c.release(lease)
            ok = all(dst[i * {SEG}:(i + 1) * {SEG}].tobytes() == h * ({SEG} // 32) for i, h in enumerate(hs))
            print(lease.hit_blocks, ok, len(segs))
        # A scheduler-only client: no arena, lookups and leases all the same.
        with _native.Client(sys.argv[1], map_arena=False) as s:
            ns = s.register_namespace(fp, {SEG})
            with s.lookup(ns, hs) as lease:
                print(lease.hit_blocks)
        """
    assert run_limited(reader, m.socket).split() == [str(SEGMENTS), "True", str(SEGMENTS), str(SEGMENTS)]

    # Nothing leaked: every lease of both clients is gone.
    assert m.stats()["live_leases"] == 0
    assert len(hashes) == SEGMENTS
