"""Measure the SSD admission policy on the demo workload (same run, same
machine): a DRAM arena smaller than the working set, an SSD tier, and
each `--ssd-write-policy` (evict, eager) with `--ssd-admit-hits` 0 and 1.
Reports hit rate, SSD bytes written (wear) and blocks staged back.

Usage: python benches/ssd_admission.py [--dir DIR] [--out bench-results/ssd_admission.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any


def demo(out: str, dram_size: str, *flags: str) -> dict[str, Any] | None:
    """One `orbitkv demo` run (2 clients, quiet) with `flags`: its JSON, or
    `None` after printing its output when it failed."""
    r = subprocess.run(
        [sys.executable, "-m", "orbitkv", "demo", "--quiet", "--clients", "2", "--dram-size", dram_size, *flags,
         "--json", out],
        capture_output=True,
        text=True,
    )  # fmt: skip
    if r.returncode != 0:
        print(r.stdout, r.stderr, file=sys.stderr)
        return None
    with open(out) as f:
        res: dict[str, Any] = json.load(f)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None, help="SSD directory parent (default: a temp dir on disk, not tmpfs)")
    ap.add_argument("--out", default="bench-results/ssd_admission.json")
    ap.add_argument("--dram-size", default="192MiB")
    a = ap.parse_args()
    base = a.dir or tempfile.mkdtemp(prefix="orbitkv-admission-", dir="/var/tmp")
    rows = []
    try:
        res = demo(os.path.join(base, "demo-dram-only.json"), a.dram_size)
        if res is None:
            return 1
        rows.append(
            {
                "write_policy": "no SSD tier",
                "admit_hits": None,
                "hit_rate": res["hit_rate"],
                "ssd_bytes_written": 0,
                "mismatched_blocks": res["mismatched_blocks"],
            }
        )
        print(json.dumps(rows[-1]))
        for policy, hits in (("evict", 0), ("evict", 1), ("eager", 0), ("eager", 1)):
            ssd = os.path.join(base, f"ssd-{policy}-{hits}")
            shutil.rmtree(ssd, ignore_errors=True)
            out = os.path.join(base, f"demo-{policy}-{hits}.json")
            res = demo(out, a.dram_size, "--ssd-dir", ssd, "--ssd-admit-hits", str(hits),
                       "--ssd-write-policy", policy, "--ssd-capacity", "2GiB")  # fmt: skip
            if res is None:
                return 1
            m = res["manager"]
            row = {
                "write_policy": policy,
                "admit_hits": hits,
                "hit_rate": res["hit_rate"],
                "ssd_bytes_written": m["ssd_bytes_written_total"],
                "ssd_spilled_blocks": m["ssd_spilled_blocks_total"],
                "ssd_staged_blocks": m["ssd_staged_blocks_total"],
                "dram_evictions_dropped": m["evictions_total"],
                "blocks_committed": m["blocks_committed_total"],
                "mismatched_blocks": res["mismatched_blocks"],
                "restores_failed": res["restores_failed"],
            }
            rows.append(row)
            print(json.dumps(row))
    finally:
        if a.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"bench": "ssd_admission", "dram_size": a.dram_size, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
