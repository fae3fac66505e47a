"""GPU probe of the DRAM arena design (level L3): a real Manager's memfd arena,
mapped by a client, pinned with cudaHostRegister, moved to and from GPU pages.

Compares, in the same run and process:
  - one gather/scatter kernel reading/writing the mapped arena (zero-copy),
  - one cudaMemcpyAsync per block (the naive path),
  - contiguous pinned DMA of the same bytes (the PCIe ceiling),
and verifies every byte both ways through the real Manager (save from GPU pages
→ commit → a second client restores on the CPU; CPU save → GPU restore).

Needs CuPy and a CUDA GPU. Usage: python benches/gpu_arena.py --out results.json [--hugepages 2MiB]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time

import cupy as cp
import numpy as np

from orbitkv import _native
from orbitkv.launch import ManagerStartError, start_serve

KERNEL = r"""
extern "C" __global__ void copy_blocks(const unsigned long long* src, const unsigned long long* dst,
                                       unsigned long long nbytes) {
    const uint4* s = reinterpret_cast<const uint4*>(src[blockIdx.x]);
    uint4* d = reinterpret_cast<uint4*>(dst[blockIdx.x]);
    const unsigned long long n = nbytes / 16;
    for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
}
"""


def start_manager(dram: str, hugepages: str) -> tuple[subprocess.Popen[bytes], str]:
    d = tempfile.mkdtemp(prefix="orbitkv-gpu-")
    sock = os.path.join(d, "m.sock")
    try:
        p = start_serve(sock, "--dram-size", dram, "--segment-size", "1GiB", "--hugepages", hugepages)
    except ManagerStartError as e:
        raise SystemExit(f"gpu_arena: {e}") from None
    return p, sock


def timed(fn, reps: int = 5) -> float:  # type: ignore[no-untyped-def]
    fn()
    cp.cuda.Device().synchronize()
    best = float("inf")
    for _ in range(reps):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, end) / 1e3)
    return best


def key(kind: int, bb: int, i: int) -> bytes:
    return bytes([kind]) + bb.to_bytes(4, "little") + i.to_bytes(4, "little") + bytes(23)


def block_bytes_for(i: int, bb: int) -> np.ndarray:
    rng = np.random.default_rng(i)
    return rng.integers(0, 256, bb, dtype=np.uint8)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dram-size", default="6GiB")
    ap.add_argument("--hugepages", default="off", help="the Manager's --hugepages (off, 2MiB, 1GiB)")
    a = ap.parse_args()
    kernel = cp.RawKernel(KERNEL, "copy_blocks")
    proc, sock = start_manager(a.dram_size, a.hugepages)
    results: dict[str, object] = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "sizes": []}
    try:
        saver = _native.Client(sock)
        engine = _native.Client(sock)
        # cudaDevAttrCanUseHostPointerForRegisteredMem (91): registered host memory is
        # addressable from kernels at its host address (UVA), so no separate device pointer.
        if cp.cuda.runtime.deviceGetAttribute(91, 0) != 1:
            raise SystemExit("this GPU cannot use host pointers for registered memory")
        t0 = time.perf_counter()
        dev_base = {}
        for seg, _size in engine.segments():
            addr, n = engine.segment_address(seg)
            cp.cuda.runtime.hostRegister(addr, n, 2)  # cudaHostRegisterMapped
            dev_base[seg] = (addr, addr)
        results["register_seconds"] = time.perf_counter() - t0
        results["arena_bytes"] = sum(n for _, n in engine.segments())
        results["arena_page_bytes"] = engine.stats()["dram_page_bytes"]

        for bb, nblocks in ((16 << 10, 8192), (64 << 10, 4096), (256 << 10, 1024), (2 << 20, 256)):
            ns = saver.register_namespace(bb.to_bytes(8, "little") + bytes(24), bb)
            hashes = [key(1, bb, i) for i in range(nblocks)]
            data = np.stack([block_bytes_for(i, bb) for i in range(nblocks)])
            r = saver.save(ns, hashes, data)
            assert r.stored == nblocks, r
            ens = engine.register_namespace(bb.to_bytes(8, "little") + bytes(24), bb)
            lease = engine.lookup(ens, hashes)
            assert lease.hit_blocks == nblocks
            slots = engine.acquire(lease)
            # GPU "KV pages": twice as many pages as blocks, blocks land on a random permutation.
            pages = cp.zeros((2 * nblocks, bb), dtype=cp.uint8)
            perm = np.random.default_rng(bb).permutation(2 * nblocks)[:nblocks]
            src = cp.asarray(np.array([dev_base[s][1] + o for s, o in slots], dtype=np.uint64))
            dst = cp.asarray(np.array([pages.data.ptr + int(p) * bb for p in perm], dtype=np.uint64))
            nbytes = nblocks * bb

            def gather() -> None:
                kernel((nblocks,), (256,), (src, dst, cp.uint64(bb)))

            t_kernel = timed(gather)
            host_src = [dev_base[s][0] + o for s, o in slots]

            def per_block() -> None:
                stream = cp.cuda.get_current_stream()
                for i, p in enumerate(perm):
                    cp.cuda.runtime.memcpyAsync(pages.data.ptr + int(p) * bb, host_src[i], bb, 1, stream.ptr)

            t_memcpy = timed(per_block, reps=3)
            # Verify restore bytes.
            got = cp.asnumpy(pages[cp.asarray(perm)])
            restore_ok = bool(np.array_equal(got, data))

            # Contiguous pinned DMA of the same byte count (PCIe ceiling).
            pinned = cp.cuda.alloc_pinned_memory(nbytes)
            big = cp.empty(nbytes, dtype=cp.uint8)
            t_dma = timed(
                lambda: cp.cuda.runtime.memcpyAsync(
                    big.data.ptr, pinned.ptr, nbytes, 1, cp.cuda.get_current_stream().ptr
                )
            )

            # Save path: scatter GPU pages → fresh arena slots → commit; verify from another client.
            hashes2 = [key(2, bb, i) for i in range(nblocks)]
            pend = engine.begin_save(ens, hashes2)
            assert pend.statuses == ["allocated"] * nblocks
            sdst = cp.asarray(np.array([dev_base[s][1] + o for s, o in pend.slots], dtype=np.uint64))

            def scatter() -> None:
                kernel((nblocks,), (256,), (dst, sdst, cp.uint64(bb)))

            t_save = timed(scatter)
            cp.cuda.Device().synchronize()  # drained before commit
            engine.commit_save(pend)
            check = saver.lookup(ns, hashes2)
            out = np.zeros((nblocks, bb), dtype=np.uint8)
            saver.restore(check, out)
            saver.release(check)
            save_ok = bool(np.array_equal(out, data))
            engine.release(lease)
            row = {
                "block_bytes": bb,
                "blocks": nblocks,
                "bytes": nbytes,
                "restore_kernel_gbps": nbytes / t_kernel / 1e9,
                "restore_per_block_memcpy_gbps": nbytes / t_memcpy / 1e9,
                "save_kernel_gbps": nbytes / t_save / 1e9,
                "contiguous_pinned_h2d_gbps": nbytes / t_dma / 1e9,
                "restore_bytes_exact": restore_ok,
                "save_bytes_exact": save_ok,
            }
            print(json.dumps(row), flush=True)
            results["sizes"].append(row)  # type: ignore[union-attr]
        for _seg, (addr, _) in dev_base.items():
            cp.cuda.runtime.hostUnregister(addr)
        engine.close()
        saver.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=2)
    rows: list[dict[str, object]] = results["sizes"]  # type: ignore[assignment]
    ok = all(r["restore_bytes_exact"] and r["save_bytes_exact"] for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
