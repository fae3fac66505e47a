"""`orbitkv.load_wait_us` against reporting loads a step later (CPU).

A fresh engine (the released vLLM `Scheduler`, OrbitKV's worker role over real CPU KV
pages, a real Manager process) serves requests whose prompts another engine saved, one
at a time, beside `--running` requests that keep decoding. Two variants, alternated per
repetition, in the same run:
  * `nowait` - the default: a load started in a step is reported by a later step's
               results, and its request prefills in the step after that;
  * `wait`   - `orbitkv.load_wait_us = 100000`: the worker lets the step's loads complete
               before it reports, so the request prefills in the next step.
Each step sleeps `--step-ms` to stand for the model's forward (there is no model on a CPU
box). Reported per hit: engine steps and milliseconds from its arrival to its first
token, median per variant, and the wait/nowait ratio of the medians (paired by
repetition). What this measures is the number of engine steps a hit costs; the copy
itself is a host memcpy here, so the GPU's figure needs `benches/engine_ttft.py
--orbitkv-variant 'wait={"orbitkv.load_wait_us": 200000}'`.

Run inside a vLLM venv (scripts/vllm-venv.sh PIN) with the native wheel:
    python benches/vllm_load_wait.py [--reps 3] [--hits 8] [--step-ms 10]
Writes bench-results/vllm_load_wait.json.
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
from vllm_harness import BLOCK, Engine, make_vllm_config, prompt_tokens  # noqa: E402

MODES = {"nowait": {}, "wait": {"orbitkv.load_wait_us": 100_000}}


def first_token_after(e: Engine, req_id: str, step_s: float, limit: int = 1000) -> tuple[float, int]:
    """Step `e` until `req_id` has a first token: (seconds, steps) since the call. Each
    step sleeps `step_s` for the forward before its output counts."""
    t0 = time.perf_counter()
    for step in range(1, limit + 1):
        res = e.step()
        time.sleep(step_s)
        for eco in res.engine_outputs.values():
            if any(o.request_id == req_id and o.new_token_ids for o in eco.outputs):
                return time.perf_counter() - t0, step
    raise RuntimeError(f"{req_id}: no first token after {limit} steps")


def run_variant(mode: str, model_dir: Path, sock: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    hits = [prompt_tokens(args.hit_blocks * BLOCK + 1, seed + i) for i in range(args.hits)]
    saver = Engine.build(make_vllm_config(model_dir, socket_path=sock), num_blocks=1024)
    for p in hits:
        r = saver.submit(p, max_tokens=1)
        saver.run_to_completion([r.request_id], max_steps=2000)
    saver.run_until_drained()
    saver.shutdown()
    e = Engine.build(make_vllm_config(model_dir, socket_path=sock, extra=MODES[mode]), num_blocks=1024)
    try:
        for i in range(args.running):  # decoding beside every hit
            e.submit(prompt_tokens(32, seed + 10_000 + i), max_tokens=1000)
        e.step()
        ms: list[float] = []
        steps: list[int] = []
        for p in hits:
            r = e.submit(p, max_tokens=1)
            took, n = first_token_after(e, r.request_id, args.step_ms / 1000)
            ms.append(1000 * took)
            steps.append(n)
        side = e.connector.scheduler_side.counters
        return {
            "mode": mode,
            "ttft_ms": ms,
            "ttft_steps": steps,
            "ttft_ms_median": statistics.median(ms),
            "ttft_steps_median": statistics.median(steps),
            "hit_blocks": side["hit_blocks"],
            "loads_failed": side["loads_failed"],
        }
    finally:
        e.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    hit_args(ap, "vllm_load_wait")
    ap.add_argument("--running", type=int, default=2, help="requests decoding beside the hits")
    args = ap.parse_args()
    import vllm

    runs = vllm_ab(
        list(MODES),
        args,
        run_variant,
        lambda r: f"first token after {r['ttft_steps_median']} steps, {r['ttft_ms_median']:.1f} ms",
    )
    report = {
        "benchmark": "vllm_load_wait",
        "vllm": vllm.__version__,
        "workload": {k: getattr(args, k) for k in ("hits", "hit_blocks", "running", "step_ms")},
        "baseline": "nowait: loads reported by a later step (the default), same run, alternated per repetition",
        "runs": runs,
        "summary": {
            **{f"{m}_{k}": median_of(runs, m, k) for m in MODES for k in ("ttft_steps_median", "ttft_ms_median")},
            "wait_over_nowait_paired_median": paired_median(runs, "wait", "nowait", "ttft_ms_median"),
        },
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
