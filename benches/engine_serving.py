#!/usr/bin/env python3
"""A multi-turn conversation workload through the released vLLM on a GPU host, with a
GPU KV budget that forces eviction: no connector, vLLM's OffloadingConnector and
OrbitKV, same run, same trace, same HBM budget, the same host-memory bytes for both
offloaders.

The trace is the seeded chat generator of benches/trace_replay.py (`generate`): each
request is a list of block ids (a conversation's earlier prompt plus new blocks, one
system block shared by all); each id becomes `--tokens-per-id` pseudo-random tokens.
Requests enter in trace order with at most `--concurrency` in flight (a new one as soon
as one finishes), each generating `--max-tokens` tokens. Reported per system: requests/s,
generated tokens/s, time to first token p50/p99 (from the request's entry), and the share
of prompt tokens served from a cache; ratios to no connector.

    python3 benches/engine_serving.py --out serving.json [--requests 200] [--hbm-blocks 2048]
        [--orbitkv-variant 'dma={"orbitkv.copy_kernel": "dma"}' ...]

`--orbitkv-variant NAME=JSON` adds the system `orbitkv_NAME`: OrbitKV with those connector
settings (a fresh Manager, as for `orbitkv`), after the `--systems` rows.

Model: the Llama-3-8B shape with vLLM's dummy weights (benches/engine_ttft.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python" / "tests" / "gpu_engine"))
sys.path.insert(0, str(ROOT / "benches"))

from engine_ttft import parse_variants, write_model  # noqa: E402
from gpu_suite import BLOCK, Manager, connector_config, run_driver  # noqa: E402
from trace_replay import generate  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def summary(res: dict[str, Any]) -> dict[str, Any]:
    ph = next(p for p in res["phases"] if p["op"] == "serve_trace")
    reqs = ph["requests"]
    ttft = [r["ttft_s"] for r in reqs]
    prompt = sum(r["prompt_tokens"] for r in reqs)
    return {
        "requests": len(reqs),
        "wall_s": ph["wall_s"],
        "requests_per_s": len(reqs) / ph["wall_s"],
        "generated_tokens_per_s": sum(r["generated"] for r in reqs) / ph["wall_s"],
        "ttft_p50_s": statistics.median(ttft),
        "ttft_p99_s": pct(ttft, 0.99),
        "cached_token_share": sum(r["num_cached_tokens"] for r in reqs) / prompt,
        "manager": ph.get("manager", {}),
        "vllm_metrics": ph.get("vllm_metrics", {}),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokens-per-id", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument(
        "--hbm-blocks",
        type=int,
        default=2048,
        help="vLLM's KV cache in 16-token blocks (the same tokens in the release's own block size)",
    )
    ap.add_argument("--host-gib", type=float, default=24.0, help="OrbitKV's arena and OffloadingConnector's CPU bytes")
    ap.add_argument("--mode", choices=("eager", "compile"), default="compile")
    ap.add_argument("--systems", default="none,offloading,orbitkv")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--orbitkv-variant", action="append", default=[], metavar="NAME=JSON")
    args = ap.parse_args()
    variants = parse_variants(ap, args.orbitkv_variant, connector_only=True)
    systems = args.systems.split(",")
    unknown = [s for s in systems if s not in ("none", "offloading", "orbitkv")]
    if unknown:
        ap.error(f"--systems: unknown {unknown}")
    trace = generate(args.requests, args.seed)
    longest = max(len(r) for r in trace) * args.tokens_per_id
    if longest + args.max_tokens > args.hbm_blocks * 16 // args.concurrency:
        ap.error(f"the longest request ({longest} tokens) times --concurrency does not fit --hbm-blocks; raise it")
    work = args.work or Path(tempfile.mkdtemp(prefix="engine-serving-"))
    work.mkdir(parents=True, exist_ok=True)
    model = write_model(work / "llama-8b-shape")
    prompts = [[[1_000_000 + b, args.tokens_per_id] for b in req] for req in trace]
    llm = {
        "dtype": "bfloat16",
        "load_format": "dummy",
        "max_model_len": longest + args.max_tokens + 16,
        "max_num_batched_tokens": 8192,
        # The same HBM tokens whatever the release's block size (64 from vLLM 0.34.0).
        "num_gpu_blocks_override": args.hbm_blocks * 16 // BLOCK,
        "gpu_memory_utilization": 0.6,
        "seed": 0,
        "enforce_eager": args.mode == "eager",
    }
    phase = {
        "op": "serve_trace",
        "tag": "trace",
        "prompts": prompts,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
    }
    warm = {"op": "generate", "tag": "warmup", "prompts": [[[7, 512]], [[8, 2048]]], "max_tokens": 1}
    base = {"model": str(model), "metrics": True, "phases": [warm, phase]}
    out: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "block_size": BLOCK,
        "trace_requests": len(trace),
        "unique_ids": len({b for r in trace for b in r}),
        "systems": {},
    }
    t0 = time.monotonic()
    runs = [(s, {}) for s in systems] + [(f"orbitkv_{n}", extra) for n, extra in variants.items()]
    for system, extra in runs:
        if system == "none":
            res = run_driver(base | {"llm": llm}, work, "none", timeout=900)
        elif system == "offloading":
            res = run_driver(
                base | {"llm": llm | {"kv_offloading_size": args.host_gib, "kv_offloading_backend": "native"}},
                work,
                "offloading",
                timeout=900,
            )
        else:  # orbitkv or a variant of it
            m = Manager(work / f"manager_{system}.log", "--dram-size", f"{int(args.host_gib)}GiB")
            try:
                cfg = connector_config(m.socket, **extra)
                res = run_driver(
                    base | {"socket": m.socket, "llm": llm | {"kv_transfer_config": cfg}}, work, system, timeout=900
                )
            finally:
                m.stop()
        out["systems"][system] = summary(res)
        out["wall_s"] = time.monotonic() - t0
        args.out.write_text(json.dumps(out, indent=1))  # a run cut short keeps what it measured
        print(
            f"engine_serving: {system}: {json.dumps(out['systems'][system])} ({time.monotonic() - t0:.0f} s)",
            flush=True,
        )
    base_sys = out["systems"].get("none")
    if base_sys:
        for s in out["systems"].values():
            s["throughput_over_none"] = s["requests_per_s"] / base_sys["requests_per_s"]
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
