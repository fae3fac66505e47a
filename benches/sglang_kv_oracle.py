"""Copy-backend oracle for the OrbitKV SGLang linker (contract G4) on the released pools.

Run inside an SGLang venv (scripts/sglang-venv.sh; 0.5.21 or 0.5.23, whose own linker
module is used) with the orbitkv wheel installed:

    PATH=$VENV/bin:$PATH $VENV/bin/python benches/sglang_kv_oracle.py [--out FILE.json]

For each released dense pool (`MHATokenToKVPool`, `MLATokenToKVPool`, CPU tensors) it
1. fills every byte of a source pool with a sentinel pattern unique to (buffer, page,
   byte) and offloads a scattered set of pages through `OrbitKVLinker.offload` into a
   real Manager process;
2. fills a destination pool with a different sentinel, looks the keys up, and loads a
   *partial* destination set (every other key, into other page ids) through
   `lookup` / `load` / `start_layer_wise_loading` / `pop_completed_load` (0.5.21) or
   `finish_layer_wise_loading` (0.5.23);
3. checks the full payload of every destination page against the source pattern, and
   that every byte outside the destinations still holds the destination sentinel
   (nothing written out of bounds, pad page 0 untouched);
4. corrupts one byte of one cached block in the Manager's shared arena (through a
   second client's mapping) and checks that the oracle flags exactly that block.
Fixture bytes are sentinel patterns, not model KV (model correctness is gated apart).
Prints one JSON document (and writes it with --out).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

# The SGLang CPU pools, shared with the SGLang suite (python/tests/support).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "tests" / "support"))
from sglang_pools import cpu_pool, pool_buffers

SGLANG = version("sglang")  # 0.5.21 or 0.5.23: the per-release linker module is used
PAGE = 16
PAGES = 48


def _manager(sock: Path, log: Path) -> subprocess.Popen[bytes]:
    from orbitkv.launch import ManagerStartError, start_serve

    try:
        return start_serve(
            sock, "--dram-size", "64MiB", "--segment-size", "16MiB", timeout_s=20,
            stdout=open(log, "wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
    except ManagerStartError as e:
        raise RuntimeError(f"Manager did not start ({e}): {log.read_text()[-2000:]}") from None


def _pool(kind: str) -> Any:
    return cpu_pool(kind, pages=PAGES, page=PAGE, layers=4, heads=4, head_dim=32, kv_lora_rank=64, rope_dim=16)


def _buffers(pool: Any, kind: str) -> list[torch.Tensor]:
    return pool_buffers(pool, kind)


def _pattern(tag: bytes, buf: int, page: int, nbytes: int) -> torch.Tensor:
    """Bytes unique to (tag, buffer, page, offset): a SHA-256 counter stream."""
    out = bytearray()
    i = 0
    while len(out) < nbytes:
        out += hashlib.sha256(
            tag + buf.to_bytes(2, "little") + page.to_bytes(4, "little") + i.to_bytes(4, "little")
        ).digest()
        i += 1
    return torch.frombuffer(bytes(out[:nbytes]), dtype=torch.uint8).clone()


def _page_rows(t: torch.Tensor, page: int) -> torch.Tensor:
    rows = t.view(torch.uint8).reshape(t.shape[0], -1)
    return rows[page * PAGE : (page + 1) * PAGE].reshape(-1)


def _fill(pool_bufs: list[torch.Tensor], tag: bytes) -> None:
    for b, t in enumerate(pool_bufs):
        for p in range(t.shape[0] // PAGE):
            _page_rows(t, p).copy_(_pattern(tag, b, p, _page_rows(t, p).numel()))


def _transfer(keys: list[str], pages: list[int] | None) -> Any:
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

    idx = None
    if pages is not None:
        idx = torch.tensor([p * PAGE + o for p in pages for o in range(PAGE)], dtype=torch.int64)
    return PoolTransfer(name=PoolName.KV, keys=keys, device_indices=idx)


def _linker(kind: str, pool: Any, sock: Path) -> Any:
    from orbitkv.hashing import fingerprint
    from orbitkv.sglang.config import SGLangSettings

    settings = SGLangSettings(socket_path=str(sock), timeout_ms=5000)
    if SGLANG == "0.5.23":
        from orbitkv.sglang.v0_5_23 import OrbitKVLinker as Linker23

        return Linker23.for_pool(settings, fingerprint(oracle=kind), pool, PAGE)
    from orbitkv.sglang.v0_5_21 import OrbitKVLinker, describe_pool

    linker = OrbitKVLinker(settings, fingerprint(oracle=kind), describe_pool(pool, PAGE))
    linker.page_size = PAGE
    return linker


def _load(linker: Any, rid: str, keys: list[str], dst_pages: list[int]) -> tuple[int, float]:
    t0 = time.perf_counter()
    hits = linker.lookup(rid, [_transfer(keys, None)])
    if len(hits) != len(keys):
        raise RuntimeError(f"lookup restored {len(hits)} of {len(keys)} pages")
    # Partial destinations: every other key of the hit, into unrelated page ids.
    sel = list(range(0, len(keys), 2))
    assert linker.load(rid, [_transfer([keys[i] for i in sel], [dst_pages[i] for i in sel])])
    index = linker.start_layer_wise_loading()
    if SGLANG == "0.5.23":  # the scheduler waits for the batch after its forward
        assert linker.finish_layer_wise_loading(index)
    else:  # 0.5.21: the event poll pops completed batches
        while linker.num_completed_loads() == 0:
            time.sleep(0.001)
        assert linker.pop_completed_load() == [rid]
    return len(sel), time.perf_counter() - t0


def _check(src_tag: bytes, dst_tag: bytes, bufs: list[torch.Tensor], mapping: dict[int, int]) -> dict[str, Any]:
    """mapping: destination page -> source page. Returns the mismatching (buffer, page) pairs."""
    bad: list[list[int]] = []
    checked = 0
    for b, t in enumerate(bufs):
        for p in range(t.shape[0] // PAGE):
            got = _page_rows(t, p)
            want = (
                _pattern(src_tag, b, mapping[p], got.numel()) if p in mapping else _pattern(dst_tag, b, p, got.numel())
            )
            checked += got.numel()
            if not torch.equal(got, want):
                bad.append([b, p])
    return {"bytes_checked": checked, "mismatched_buffer_pages": bad}


def run(kind: str, sock: Path) -> dict[str, Any]:
    src = _pool(kind)
    src_bufs = _buffers(src, kind)
    _fill(src_bufs, b"src")
    link_src = _linker(kind, src, sock)
    src_pages = [3, 7, 8, 20, 21, 22, 30, 41]  # scattered, page 0 (pad) excluded
    keys = [hashlib.sha256(f"{kind}-block-{i}".encode()).hexdigest() for i in range(len(src_pages))]
    t0 = time.perf_counter()
    assert link_src.offload([_transfer(keys, src_pages)])
    while link_src.num_completed_offloads() == 0:
        time.sleep(0.001)
    assert link_src.pop_completed_offload()
    offload_s = time.perf_counter() - t0

    dst = _pool(kind)
    dst_bufs = _buffers(dst, kind)
    _fill(dst_bufs, b"dst")
    link_dst = _linker(kind, dst, sock)
    dst_pages = [40, 2, 33, 5, 17, 9, 46, 11]
    loaded, load_s = _load(link_dst, "oracle-1", keys, dst_pages)
    mapping = {dst_pages[i]: src_pages[i] for i in range(0, len(keys), 2)}
    clean = _check(b"src", b"dst", dst_bufs, mapping)

    # Deliberate corruption: flip one byte of the third loaded block inside the arena.
    from orbitkv import _native

    victim = 2
    with _native.Client(str(sock), timeout_ms=5000) as c:
        ns = c.register_namespace(link_dst.fingerprint, link_dst.geometry.block_bytes)
        lease = c.lookup(ns, [bytes.fromhex(keys[victim * 2])])
        ((seg, off),) = c.acquire(lease)
        addr, _ = c.segment_address(seg)
        byte = ctypes.c_uint8.from_address(addr + off + 123)
        byte.value ^= 0xFF
        c.release(lease)
    dst2 = _pool(kind)
    dst2_bufs = _buffers(dst2, kind)
    _fill(dst2_bufs, b"dst")
    link_dst2 = _linker(kind, dst2, sock)
    try:
        _load(link_dst2, "oracle-2", keys, dst_pages)
        corrupt = _check(b"src", b"dst", dst2_bufs, mapping)
        outcome = "served"
    except RuntimeError as exc:  # a Manager that verifies checksums refuses the block instead
        corrupt = {"bytes_checked": 0, "mismatched_buffer_pages": [], "error": str(exc)}
        outcome = "refused"
    # The corrupted byte lies in the first page-buffer of the victim block's cached bytes.
    victim_page = dst_pages[victim * 2]
    detected = outcome == "refused" or corrupt["mismatched_buffer_pages"] == [[0, victim_page]]
    for link in (link_src, link_dst, link_dst2):
        link.close()
    g = link_dst.geometry
    return {
        "pool": type(src).__name__,
        "page_size": PAGE,
        "block_bytes": g.block_bytes,
        "buffers": len(src_bufs),
        "offloaded_blocks": len(keys),
        "loaded_blocks": loaded,
        "offload_seconds": offload_s,
        "load_seconds": load_s,
        "clean": clean,
        "corruption": {"outcome": outcome, **corrupt, "detected": detected},
        "ok": not clean["mismatched_buffer_pages"] and detected,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from importlib.metadata import version

    with tempfile.TemporaryDirectory(prefix="okv-oracle-", dir="/tmp") as d:
        os.chmod(d, 0o700)
        sock = Path(d) / "m.sock"
        mgr = _manager(sock, Path(d) / "manager.log")
        try:
            results = [run(kind, sock) for kind in ("mha", "mla")]
        finally:
            mgr.terminate()
            mgr.wait(timeout=10)
    doc = {
        "bench": "sglang_kv_oracle",
        "sglang": version("sglang"),
        "torch": torch.__version__,
        "results": results,
        "ok": all(r["ok"] for r in results),
    }
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
