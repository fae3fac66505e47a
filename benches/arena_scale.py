"""Arena sizes: start-up, handshake and pinning of a real Manager's arena at the sizes hosts use.

Sections (each writes its rows into one JSON; `--png` draws cost against size):

- `startup`: for each `--dram-size`, rounds of (baseline, Manager) in alternating
  order. Baseline: `first_touch` (benches/first_touch.rs) writes every page of the
  same bytes on the same number of threads as the Manager, with no Manager, in three
  kinds of memory (private anonymous, one memfd, as many memfds as the Manager makes
  segments). Ratios: against the fastest shared-memory baseline (the same kind of
  memory as the arena) and against the fastest of all three. Manager: `orbitkv serve
  --dram-size N` with default flags, from spawn to the first client accepted
  (start-to-serving), and the populate time it logs. The VM's memory grows as it is
  touched, so only the per-round ratio is meaningful.
- `handshake`: with that Manager serving, the first client of a fresh process that
  maps the arena (fd batches, one mapping per segment; its page tables are filled
  later on a background thread) and a control-only one, median of 5 processes each.
- `segments`: one arena size split into several segment sizes (auto and smaller):
  segment count, start-to-serving and the mapping client's handshake, to choose the
  default by measurement.
- `hugepages` (with `--hugepages 2MiB,1GiB`): for each page size, reserve the pages
  for `--hugepages-dram` where this user may (root), start a Manager on them, record
  start-to-serving and the populate time it logs, and give the pages back. A size
  that cannot be reserved is reported as such.
- `gpu` (with `--gpu`, needs torch with CUDA): in a fresh worker process, `ArenaView`
  pins the whole arena (`cudaHostRegister`, timed per process), then blocks saved
  from GPU pages through `orbitkv.kvcopy` are restored by a second process's engine
  into other GPU pages and compared byte for byte.

The baseline binary is built on first use, or taken from $ORBITKV_FIRST_TOUCH.

Usage: python benches/arena_scale.py --out arena.json [--dram-size 4GiB,96GiB] [--rounds 2]
       [--segments-dram 4GiB --segment-sizes auto,256MiB,16MiB,1MiB] [--gpu] [--png arena.png]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from orbitkv.launch import serve_command, wait_until_serving

ROOT = Path(__file__).resolve().parent.parent
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
POPULATED = re.compile(r"populated on (\d+) threads in ([0-9.]+) s")


def parse_size(text: str) -> int:
    for unit, mult in UNITS.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * mult)
    return int(text)


FIRST_TOUCH = os.environ.get("ORBITKV_FIRST_TOUCH", str(ROOT / "target" / "release" / "first_touch"))


def first_touch_bin() -> str:
    exe = Path(FIRST_TOUCH)
    if not exe.exists():
        subprocess.run(
            ["cargo", "build", "--release", "-q", "-p", "orbitkv-benches", "--bin", "first_touch"], check=True, cwd=ROOT
        )
    return str(exe)


def baseline(nbytes: int, threads: int, kind: str) -> dict[str, Any]:
    out = subprocess.run([first_touch_bin(), str(nbytes), str(threads), kind], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"first_touch failed: {out.stderr}")
    return dict(json.loads(out.stdout))


def auto_segments(nbytes: int) -> int:
    """Segments of `--segment-size auto` (config::auto_segment_size) on 4 KiB pages."""
    unit = 256 << 20
    per = (nbytes + 63) // 64
    seg = max(unit, (per + unit - 1) // unit * unit)
    return (nbytes + seg - 1) // seg


class Serving:
    """A Manager started with `flags`, timed from spawn to the first client accepted."""

    def __init__(self, tmp: str, *flags: str, timeout_s: float = 600.0) -> None:
        self.socket = os.path.join(tmp, "m.sock")
        self.log = open(os.path.join(tmp, "manager.log"), "w+b")  # closed in stop()
        t0 = time.monotonic()
        self.proc = subprocess.Popen(serve_command(self.socket, *flags, log_level="info"), stderr=self.log)
        try:
            wait_until_serving(self.proc, self.socket, timeout_s)
        except Exception:
            self.log.seek(0)
            sys.stderr.write(self.log.read().decode(errors="replace"))
            raise
        self.start_to_serving_s = time.monotonic() - t0
        self.log.seek(0)
        text = self.log.read().decode(errors="replace")
        m = POPULATED.search(text)
        self.populate_threads = int(m.group(1)) if m else None
        self.populate_s = float(m.group(2)) if m else None

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=120)
        self.log.close()


HANDSHAKE = """
import json, sys, time
from orbitkv import _native
t0 = time.perf_counter()
c = _native.Client(sys.argv[1], map_arena=sys.argv[2] == "map")
took = time.perf_counter() - t0
print(json.dumps({"s": took, "segments": len(c.segments())}))
c.close()
"""


def handshakes(socket: str, reps: int = 5) -> dict[str, Any]:
    """Median connect time of a fresh process's first client (as an engine worker
    connects once): mapping the arena, and control-only."""
    times: dict[str, list[float]] = {"map": [], "control": []}
    segments = 0
    for _ in range(reps):
        for mode in times:
            out = subprocess.run(
                [sys.executable, "-c", HANDSHAKE, socket, mode], capture_output=True, text=True, timeout=120
            )
            if out.returncode != 0:
                raise RuntimeError(f"handshake ({mode}) failed: {out.stderr[-2000:]}")
            row = json.loads(out.stdout)
            times[mode].append(row["s"])
            segments = row["segments"]
    return {
        "segments": segments,
        "mapping_client_s": statistics.median(times["map"]),
        "control_only_client_s": statistics.median(times["control"]),
    }


def startup(sizes: list[str], rounds: int) -> list[dict[str, Any]]:
    rows = []
    for size in sizes:
        nbytes = parse_size(size)
        for r in range(rounds):
            row: dict[str, Any] = {"dram_size": size, "bytes": nbytes, "round": r}
            order = ("baseline", "manager") if r % 2 == 0 else ("manager", "baseline")
            row["order"] = list(order)
            for what in order:
                if what == "manager":
                    with tempfile.TemporaryDirectory() as tmp:
                        m = Serving(tmp, "--dram-size", size)
                        row["start_to_serving_s"] = m.start_to_serving_s
                        row["populate_s"] = m.populate_s
                        row["threads"] = m.populate_threads
                        row.update(handshakes(m.socket))
                        m.stop()
                else:
                    threads = min(int(row.get("threads") or os.cpu_count() or 1), 64)
                    # Private anonymous memory, one memfd, and as many memfds as the
                    # Manager's default makes segments (faults in one file contend on
                    # its page cache): the ratio is against the fastest of the three.
                    kinds = ["anon", "shm", f"shm:{auto_segments(nbytes)}"]
                    row["first_touch"] = {k: baseline(nbytes, threads, k)["seconds"] for k in kinds}
                    row["first_touch_s"] = min(row["first_touch"].values())
                    row["first_touch_shm_s"] = min(v for k, v in row["first_touch"].items() if k != "anon")
                    row["first_touch_threads"] = threads
            row["ratio_vs_shm"] = row["start_to_serving_s"] / row["first_touch_shm_s"]
            row["ratio_vs_fastest"] = row["start_to_serving_s"] / row["first_touch_s"]
            print(
                f"startup {size} round {r} ({'/'.join(order)}): serving in {row['start_to_serving_s']:.2f} s "
                f"(populate {row['populate_s']} s on {row['threads']} threads), first touch "
                f"{' / '.join(f'{k} {v:.2f}' for k, v in row['first_touch'].items())} s on "
                f"{row['first_touch_threads']}: ratio {row['ratio_vs_shm']:.3f} to shared memory, "
                f"{row['ratio_vs_fastest']:.3f} to the fastest; {row['segments']} segments, mapping client "
                f"{row['mapping_client_s'] * 1e3:.1f} ms, control-only {row['control_only_client_s'] * 1e3:.1f} ms",
                flush=True,
            )
            rows.append(row)
    return rows


def segments(size: str, seg_sizes: list[str]) -> list[dict[str, Any]]:
    rows = []
    for seg in seg_sizes:
        with tempfile.TemporaryDirectory() as tmp:
            m = Serving(tmp, "--dram-size", size, "--segment-size", seg)
            row = {"dram_size": size, "segment_size": seg, "start_to_serving_s": m.start_to_serving_s}
            row.update(handshakes(m.socket))
            m.stop()
        print(
            f"segments {size} / {seg}: {row['segments']} segments, serving in {row['start_to_serving_s']:.2f} s, "
            f"mapping client {row['mapping_client_s'] * 1e3:.1f} ms, control-only "
            f"{row['control_only_client_s'] * 1e3:.2f} ms",
            flush=True,
        )
        rows.append(row)
    return rows


GPU_WORKER = """
import json, random, sys, time
import torch
sys.path.insert(0, sys.argv[3])
import kv_layouts
from orbitkv import _native
from orbitkv.kvcopy import ArenaView, CopyEngine, layer_pages
sock, role = sys.argv[1], sys.argv[2]
s = kv_layouts.Shape(layers=32, blocks=512, heads=8, tokens=16, content=128)
c = _native.Client(sock)
t0 = time.perf_counter()
arena = ArenaView(c, "cuda:0")
pin_s = time.perf_counter() - t0
raw = kv_layouts.random_backing(s, 7 if role == "save" else 8, "cuda:0")
engine = CopyEngine(layer_pages(kv_layouts.views(raw, "LBNHC", s), s.blocks), arena)
rng = random.Random(5)
hashes = [rng.randbytes(32) for _ in range(256)]
ids = list(range(256))
ns = c.register_namespace(b"\\x62" * 32, engine.block_bytes)
ok = None
if role == "save":
    with c.begin_save(ns, hashes) as pending:
        engine.save(ids, pending.slots).synchronize()
        c.commit_save(pending)
    src = torch.cat([raw[s.pad:-s.pad].view(s.layers, s.blocks, -1)[:, i] for i in ids])
    torch.save(src.cpu(), sys.argv[4])
else:
    with c.lookup(ns, hashes) as lease:
        dst = list(range(256, 512))
        load = engine.load(c.acquire(lease), dst)
        load.synchronize()
        got = torch.cat([raw[s.pad:-s.pad].view(s.layers, s.blocks, -1)[:, i] for i in dst])
        ok = bool(torch.equal(got.cpu(), torch.load(sys.argv[4])))
        hit = lease.hit_blocks
    assert hit == 256, hit
engine.drain()
arena.close()
c.close()
print(json.dumps({"role": role, "pin_s": pin_s, "segments": len(c.segments()), "byte_exact": ok}))
"""


def gpu(size: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        m = Serving(tmp, "--dram-size", size)
        rows = []
        ref = os.path.join(tmp, "ref.pt")
        for role in ("save", "restore"):
            out = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    textwrap.dedent(GPU_WORKER),
                    m.socket,
                    role,
                    str(ROOT / "python" / "tests" / "support"),
                    ref,
                ],
                capture_output=True,
                text=True,
                timeout=900,
            )
            if out.returncode != 0:
                m.stop()
                raise RuntimeError(f"gpu {role} worker failed: {out.stderr[-4000:]}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        m.stop()
    row = {
        "dram_size": size,
        "bytes": parse_size(size),
        "segments": rows[0]["segments"],
        "pin_s_per_process": [r["pin_s"] for r in rows],
        "byte_exact": rows[1]["byte_exact"],
    }
    print(
        f"gpu {size}: {row['segments']} segments pinned in {', '.join(f'{p:.2f}' for p in row['pin_s_per_process'])} s "
        f"per worker process; restore byte-exact: {row['byte_exact']}",
        flush=True,
    )
    return row


HUGE_KB = {"2MiB": 2048, "1GiB": 1048576}


def hugepages(size: str, pages: list[str]) -> list[dict[str, Any]]:
    rows = []
    for page in pages:
        knob = Path(f"/sys/kernel/mm/hugepages/hugepages-{HUGE_KB[page]}kB/nr_hugepages")
        need = parse_size(size) // parse_size(page)
        row: dict[str, Any] = {"dram_size": size, "page": page, "pages": need}
        try:
            before = int(knob.read_text())
            knob.write_text(str(before + need))
            reserved = int(knob.read_text()) - before
        except OSError as e:
            row["skipped"] = f"cannot reserve {page} pages: {e}"
            print(f"hugepages {page}: {row['skipped']}", flush=True)
            rows.append(row)
            continue
        try:
            if reserved < need:
                row["skipped"] = f"asked for {need} {page} pages, the kernel reserved {reserved}"
            else:
                with tempfile.TemporaryDirectory() as tmp:
                    m = Serving(tmp, "--dram-size", size, "--hugepages", page)
                    row.update(start_to_serving_s=m.start_to_serving_s, populate_s=m.populate_s)
                    m.stop()
        finally:
            knob.write_text(str(before))
        print(f"hugepages {size} on {page}: {row.get('skipped') or row}", flush=True)
        rows.append(row)
    return rows


def draw(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    rows = result["startup"]
    gib = [r["bytes"] / (1 << 30) for r in rows]
    axes[0].plot(gib, [r["start_to_serving_s"] for r in rows], "o", label="Manager start-to-serving")
    axes[0].plot(gib, [r["first_touch_shm_s"] for r in rows], "x", label="first touch, shared memory (baseline)")
    axes[0].plot(gib, [r["first_touch"]["anon"] for r in rows], "+", label="first touch, anonymous memory")
    axes[0].set(xlabel="arena GiB", ylabel="seconds", title="start-up vs arena size", xscale="log", yscale="log")
    axes[0].legend()
    seg = result.get("segments", [])
    if seg:
        axes[1].plot([r["segments"] for r in seg], [r["mapping_client_s"] * 1e3 for r in seg], "o-")
        axes[1].set(
            xlabel="segments (same arena)",
            ylabel="mapping client handshake, ms",
            title=f"handshake vs segment count ({seg[0]['dram_size']})",
            xscale="log",
        )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dram-size", default="1GiB,4GiB")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--segments-dram", default="4GiB")
    ap.add_argument("--segment-sizes", default="auto,256MiB,16MiB,1MiB")
    ap.add_argument("--hugepages", default="", help="page sizes for the hugepages section, e.g. 2MiB,1GiB")
    ap.add_argument("--hugepages-dram", default="32GiB")
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--gpu-dram", default=None, help="arena for the gpu section [default: the largest --dram-size]")
    ap.add_argument("--png", default=None)
    ap.add_argument("--replot", action="store_true", help="only draw --png from the JSON at --out")
    a = ap.parse_args()
    if a.replot:
        draw(json.loads(Path(a.out).read_text()), a.png)
        return 0
    sizes = [s for s in a.dram_size.split(",") if s]
    result: dict[str, Any] = {
        "bench": "arena_scale",
        "host": {"cpus": os.cpu_count(), "mem_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")},
        "startup": startup(sizes, a.rounds),
    }
    if a.segment_sizes:
        result["segments"] = segments(a.segments_dram, [s for s in a.segment_sizes.split(",") if s])
    if a.hugepages:
        result["hugepages"] = hugepages(a.hugepages_dram, [p for p in a.hugepages.split(",") if p])
    if a.gpu:
        result["gpu"] = gpu(a.gpu_dram or max(sizes, key=parse_size))
    Path(a.out).write_text(json.dumps(result, indent=1))
    if a.png:
        draw(result, a.png)
    print(f"wrote {a.out}" + (f" and {a.png}" if a.png else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
