"""Source-only tests: portable hash chains (K2) and package import hygiene (O4)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from orbitkv.hashing import chain_hashes, chain_root, fingerprint


def test_chain_covers_complete_blocks_and_is_prefix_stable() -> None:
    root = chain_root(b"\x01" * 32)
    toks = list(range(100))
    h = chain_hashes(toks, 16, root)
    assert len(h) == 6 and all(len(x) == 32 for x in h)
    # Same prefix → same leading hashes; one changed token changes that block and all after.
    toks2 = [*toks[:40], 999, *toks[41:]]
    h2 = chain_hashes(toks2, 16, root)
    assert h2[:2] == h[:2]
    assert all(a != b for a, b in zip(h[2:], h2[2:], strict=True))


def test_fingerprint_and_extra_keys_separate_chains() -> None:
    # Tenant salts are bound by the namespace (Client.register_namespace), not the chain.
    toks = list(range(32))
    base = chain_hashes(toks, 16, chain_root(b"\x01" * 32))
    assert chain_hashes(toks, 16, chain_root(b"\x02" * 32)) != base
    assert chain_hashes(toks, 16, chain_root(b"\x01" * 32), extra_keys=b"lora:x") != base
    with pytest.raises(ValueError):
        chain_root(b"short")
    with pytest.raises(ValueError):
        chain_hashes(toks, 0, chain_root(b"\x01" * 32))


def test_fingerprint_is_canonical() -> None:
    assert fingerprint(a=1, b="x") == fingerprint(b="x", a=1) == fingerprint({"b": "x", "a": 1})
    assert fingerprint(a=1) != fingerprint(a=2)
    with pytest.raises(TypeError):
        fingerprint(a=object())  # never a silent str()


def test_one_fingerprint_definition() -> None:
    """The adapters' identity fingerprint is the package's one definition."""
    from orbitkv import hashing
    from orbitkv.engine import identity

    assert identity.fingerprint is hashing.fingerprint
    assert identity.canonical_json is hashing.canonical_json


def test_hashes_do_not_depend_on_pythonhashseed() -> None:
    code = (
        "from orbitkv.hashing import chain_hashes, chain_root;"
        "print(chain_hashes(list(range(64)), 16, chain_root(bytes(32)))[-1].hex())"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("0", "1", "12345")
    }
    assert len(outs) == 1


def test_importing_orbitkv_loads_nothing_native_or_engine() -> None:
    code = (
        "import sys, orbitkv, orbitkv.hashing, orbitkv.cli;"
        "bad=[m for m in ('orbitkv._native','torch','vllm','sglang') if m in sys.modules];"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
