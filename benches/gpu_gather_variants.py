"""Where the copy engine's gather loses against the PCIe ceiling, on a GPU host (same
run, same pinned arena, 1 GiB of random 64 KiB rows): contiguous pinned DMA; one
`index_select` into a preallocated buffer (the ceiling the restore figures use); the
same allocating; in 64 MiB chunks; gather + `index_copy_` into random pages on one
stream; `CopyEngine.load` (two streams, events, planning on the host included); a
one-pass Triton kernel (arena row -> page, no staging), checked for exact bytes.

  python benches/gpu_gather_variants.py [--out bench-results/gpu_gather_variants.json]
"""

import argparse
import json
import os
import tempfile
import time

import torch

from orbitkv import _native
from orbitkv.kvcopy import ArenaView, CopyEngine, LayerPages
from orbitkv.launch import start_serve

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--out", default=os.path.join("bench-results", "gpu_gather_variants.json"))
ARGS = ap.parse_args()
if not torch.cuda.is_available():
    raise SystemExit("gpu_gather_variants: needs a CUDA GPU (torch.cuda.is_available() is False)")
tmp = tempfile.mkdtemp()
sock = os.path.join(tmp, "m.sock")
mgr = start_serve(sock, "--dram-size", "3GiB", "--segment-size", "1GiB", timeout_s=20)
c = _native.Client(sock)
dev = torch.device("cuda", 0)
arena = ArenaView(c, dev)
seg0 = arena.segment(0)
UNIT = 64 << 10
ROWS = (1 << 30) // UNIT  # 1 GiB of 64 KiB rows
g = torch.Generator().manual_seed(0)
src_rows = torch.randperm(seg0.numel() // UNIT, generator=g)[:ROWS].to(dev)
rows64 = seg0.view(torch.int64).view(-1, UNIT // 8)
pages = torch.empty(2 * ROWS, UNIT, dtype=torch.uint8, device=dev)
dst_ids = torch.randperm(2 * ROWS, generator=g)[:ROWS].to(dev)
out = torch.empty(ROWS, UNIT // 8, dtype=torch.int64, device=dev)
res = {}


def timed(name, fn, reps=7):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    med = ts[len(ts) // 2]
    res[name] = {"median_s": med, "gbps": (1 << 30) / med / 1e9}
    print(name, round(res[name]["gbps"], 1), flush=True)


# contiguous DMA ceiling
host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
dbuf = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
timed("dma_h2d", lambda: dbuf.copy_(host, non_blocking=True))
timed("raw_index_select_out", lambda: torch.index_select(rows64, 0, src_rows, out=out))
timed("raw_index_select_alloc", lambda: torch.index_select(rows64, 0, src_rows))
chunks = [(src_rows[i : i + 1024], out[i : i + 1024]) for i in range(0, ROWS, 1024)]
timed("chunked_64MiB_out", lambda: [torch.index_select(rows64, 0, s, out=o) for s, o in chunks])
pv = pages.view(torch.int64).view(2 * ROWS, UNIT // 8)


def two_pass():
    st = torch.index_select(rows64, 0, src_rows)
    pv.index_copy_(0, dst_ids, st)


timed("two_pass_one_stream", two_pass)
# the engine: one layer of 64 KiB pages
backing = pages.view(-1)
layer = LayerPages(backing, 0, UNIT, (UNIT,), (1,), UNIT, 2 * ROWS)
eng = CopyEngine([layer], arena)
slots = torch.stack([torch.zeros(ROWS, dtype=torch.int64), src_rows.cpu() * UNIT], 1).numpy()
ids = dst_ids.cpu().tolist()
timed("engine_load", lambda: eng.load(slots, ids).synchronize())
try:
    import triton
    import triton.language as tl

    @triton.jit
    def gather_rows(src, dst, srow, drow, n_elem, BLOCK: tl.constexpr):
        r = tl.program_id(0)
        c0 = tl.program_id(1) * BLOCK
        s = tl.load(srow + r).to(tl.int64)
        d = tl.load(drow + r).to(tl.int64)
        offs = c0 + tl.arange(0, BLOCK)
        m = offs < n_elem
        v = tl.load(src + s * n_elem + offs, mask=m)
        tl.store(dst + d * n_elem + offs, v, mask=m)

    for blk in (1024, 2048, 4096):
        n = UNIT // 8
        grid = (ROWS, triton.cdiv(n, blk))
        timed(f"triton_one_pass_b{blk}", lambda: gather_rows[grid](rows64, pv, src_rows, dst_ids, n, BLOCK=blk))
    ok = torch.equal(pv[dst_ids[:64]], rows64[src_rows[:64]])
    res["triton_exact"] = bool(ok)
    print("triton exact", ok)
except Exception as e:
    res["triton_error"] = repr(e)
    print("triton failed", e)
eng.drain()
arena.close()
c.close()
mgr.terminate()
os.makedirs(os.path.dirname(os.path.abspath(ARGS.out)), exist_ok=True)
with open(ARGS.out, "w") as f:
    json.dump(res, f, indent=1)
print("wrote", ARGS.out)
