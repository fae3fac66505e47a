"""vLLM 0.34's `--max-num-inflight-kv-loads` with OrbitKV hits under a full batch (CPU).

A fresh engine (the released vLLM 0.34.0 `Scheduler`, OrbitKV's worker role over real
CPU KV pages, a real Manager process) has every running slot taken by long misses when
requests whose prompts another engine saved arrive. Two variants, alternated per
repetition, in the same run:
  * `on`  - OrbitKV's `may_load_async` (the adapter's answer: a request OrbitKV may serve
            is looked up and loaded while the batch is full);
  * `off` - vLLM's default `may_load_async` (P/D remote prefill only): the hits wait for
            a running slot before their lookup starts.
Both run with the same `max_num_inflight_kv_loads`. Each step sleeps `--step-ms` to stand
for the model's forward (there is no model on a CPU box), so the background lookups and
copies overlap steps as they would beside a GPU forward.

Reported per hit request: time from its arrival to its first token (ms and steps),
median and p90 per variant, and the on/off ratio of the medians (paired by repetition);
per variant, the mean time of a step itself (scheduler + emulated worker, without the sleep).

Run inside the vLLM 0.34.0 venv (scripts/vllm-venv.sh 0.34.0) with the native wheel:
    python benches/vllm_inflight_loads.py [--reps 3] [--slots 4] [--hits 8] [--step-ms 10]
Writes bench-results/vllm_inflight_loads.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python" / "tests" / "vllm"))
sys.path.insert(0, str(ROOT / "benches"))

from ab_runs import hit_args, median_of, paired_median, vllm_ab, write_report  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1  # noqa: E402
from vllm_harness import BLOCK, Engine, make_request, make_vllm_config, prompt_tokens  # noqa: E402


def _save(model_dir: Path, sock: str, prompts: list[list[int]]) -> None:
    a = Engine.build(make_vllm_config(model_dir, socket_path=sock), num_blocks=512)
    reqs = [make_request(p, max_tokens=1) for p in prompts]
    for r in reqs:
        a.scheduler.add_request(r)
    a.run_to_completion([r.request_id for r in reqs], max_steps=2000)
    a.run_until_drained()
    a.shutdown()


def run_variant(variant: str, model_dir: Path, sock: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    hits = [prompt_tokens(args.hit_blocks * BLOCK + 1, seed + i) for i in range(args.hits)]
    _save(model_dir, sock, hits)
    cfg = make_vllm_config(
        model_dir,
        socket_path=sock,
        max_num_seqs=args.slots,
        scheduler={"max_num_inflight_kv_loads": args.inflight},
    )
    e = Engine.build(cfg, num_blocks=512)
    if variant == "off":
        type(e.connector).may_load_async = KVConnectorBase_V1.may_load_async  # restored below
    try:
        busy = [
            make_request(prompt_tokens(32, seed + 10_000 + i), max_tokens=args.busy_tokens) for i in range(args.slots)
        ]
        for r in busy:
            e.scheduler.add_request(r)
        e.step()
        arrivals: dict[str, tuple[float, int]] = {}
        first: dict[str, tuple[float, int]] = {}
        reqs = [make_request(p, max_tokens=2) for p in hits]
        step = 0
        for r in reqs:
            e.scheduler.add_request(r)
            arrivals[r.request_id] = (time.perf_counter(), step)
        want = {r.request_id for r in reqs}
        busy_s = 0.0  # the steps themselves (scheduler + emulated worker), without the sleeps
        while not want <= set(first) and step < 5000:
            t0 = time.perf_counter()
            res = e.step()
            step += 1
            now = time.perf_counter()
            busy_s += now - t0
            for eco in res.engine_outputs.values():
                for o in eco.outputs:
                    if o.request_id in want and o.new_token_ids and o.request_id not in first:
                        first[o.request_id] = (now, step)
            time.sleep(args.step_ms / 1000)
        e.run_until_drained(max_steps=5000)
        ms = [1000 * (first[r][0] - arrivals[r][0]) for r in want]
        steps = [first[r][1] - arrivals[r][1] for r in want]
        side = e.connector.scheduler_side.counters
        return {
            "variant": variant,
            "ttft_ms": sorted(ms),
            "ttft_ms_median": statistics.median(ms),
            "ttft_ms_p90": sorted(ms)[int(0.9 * (len(ms) - 1))],
            "ttft_steps_median": statistics.median(steps),
            "step_ms_mean": 1000 * busy_s / max(step, 1),
            "hit_blocks": side["hit_blocks"],
            "lookups": side["lookups"],
        }
    finally:
        if variant == "off":
            del type(e.connector).may_load_async  # back to the class's own (the 0.34 hook)
        e.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    hit_args(ap, "vllm_inflight_loads")
    ap.add_argument("--slots", type=int, default=4, help="max_num_seqs: running slots, all taken by misses")
    ap.add_argument("--inflight", type=int, default=8, help="max_num_inflight_kv_loads")
    ap.add_argument("--busy-tokens", type=int, default=60, help="tokens each busy request generates")
    args = ap.parse_args()
    import vllm

    if vllm.__version__ != "0.34.0":
        sys.exit(f"needs vLLM 0.34.0 (--max-num-inflight-kv-loads), found {vllm.__version__}")
    runs = vllm_ab(
        ["on", "off"],
        args,
        run_variant,
        lambda r: (
            f"TTFT median {r['ttft_ms_median']:.1f} ms, {r['ttft_steps_median']} steps, "
            f"{r['step_ms_mean']:.2f} ms per step besides the sleep"
        ),
    )
    report = {
        "benchmark": "vllm_inflight_loads",
        "vllm": vllm.__version__,
        "workload": {
            k: getattr(args, k) for k in ("slots", "inflight", "hits", "hit_blocks", "busy_tokens", "step_ms")
        },
        "baseline": "off: vLLM's default may_load_async, same run, alternated per repetition",
        "runs": runs,
        "summary": {
            "on_ttft_ms_median": median_of(runs, "on", "ttft_ms_median"),
            "off_ttft_ms_median": median_of(runs, "off", "ttft_ms_median"),
            "on_over_off_paired_median": paired_median(runs, "on", "off", "ttft_ms_median"),
        },
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
