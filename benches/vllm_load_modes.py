"""In-step loads (`orbitkv.load_mode = "sync"`) against asynchronous loads (CPU).

A fresh engine (the released vLLM `Scheduler`, OrbitKV's worker role over real CPU KV
pages, a real Manager process) serves requests whose prompts another engine saved, one
at a time, beside `--running` requests that keep decoding. Two variants, alternated per
repetition, in the same run:
  * `async` - the default: the request waits in WAITING_FOR_REMOTE_KVS while its load runs
              beside the steps, and is scheduled once a worker reported it;
  * `sync`  - `orbitkv.load_mode = "sync"`: the load runs inside the step that admits the
              request, before its forward.
Each step sleeps `--step-ms` to stand for the model's forward (there is no model on a CPU
box). Reported per hit: engine steps and milliseconds from its arrival to its first
token, median per variant, and the sync/async ratio of the medians (paired by
repetition). What this measures is the number of engine steps a hit costs; the copy
itself is a host memcpy here, so the GPU's figure needs `benches/engine_ttft.py
--orbitkv-variant 'sync={"orbitkv.load_mode": "sync"}'`.

Run inside a vLLM venv (scripts/vllm-venv.sh PIN) with the native wheel:
    python benches/vllm_load_modes.py [--reps 3] [--hits 8] [--step-ms 10]
Writes bench-results/vllm_load_modes.json.
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
sys.path.insert(0, str(ROOT / "python" / "tests" / "vllm"))

import vllm_env  # noqa: E402  (sets the CPU/offline environment before vLLM loads)
from vllm_harness import BLOCK, Engine, make_vllm_config, prompt_tokens, write_tiny_model  # noqa: E402

MODES = {"async": {}, "sync": {"orbitkv.load_mode": "sync"}}


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
            "sync_loads": side["sync_loads"],
            "loads_failed": side["loads_failed"],
        }
    finally:
        e.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--hits", type=int, default=8, help="requests whose prompts another engine saved, one at a time")
    ap.add_argument("--hit-blocks", type=int, default=32, help="blocks of each hit prompt")
    ap.add_argument("--running", type=int, default=2, help="requests decoding beside the hits")
    ap.add_argument("--step-ms", type=float, default=10.0, help="sleep per step, for the model forward")
    ap.add_argument("--out", default=str(ROOT / "bench-results" / "vllm_load_modes.json"))
    args = ap.parse_args()
    import vllm

    tmp = Path(tempfile.mkdtemp(prefix="okv-load-modes-"))
    model_dir = write_tiny_model(tmp / "tiny-llama")
    manager = vllm_env.ManagerProcess(tmp / "m.sock", tmp / "manager.log", fault_injection=False, dram_size="256MiB")
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    try:
        for rep in range(args.reps):
            for mode in list(MODES) if rep % 2 == 0 else list(MODES)[::-1]:
                seed = 1_000_000 * (rep + 1) + (500_000 if mode == "sync" else 0)
                r = run_variant(mode, model_dir, str(manager.socket_path), args, seed)
                runs[mode].append(r)
                steps, ms = r["ttft_steps_median"], r["ttft_ms_median"]
                print(f"rep {rep} {mode:5}: first token after {steps} steps, {ms:.1f} ms")
    finally:
        manager.stop()
    paired = [s["ttft_ms_median"] / a["ttft_ms_median"] for s, a in zip(runs["sync"], runs["async"], strict=True)]
    report = {
        "benchmark": "vllm_load_modes",
        "vllm": vllm.__version__,
        "workload": {k: getattr(args, k) for k in ("hits", "hit_blocks", "running", "step_ms")},
        "baseline": "async: the default load mode, same run, alternated per repetition",
        "runs": runs,
        "summary": {
            "async_ttft_steps_median": statistics.median(r["ttft_steps_median"] for r in runs["async"]),
            "sync_ttft_steps_median": statistics.median(r["ttft_steps_median"] for r in runs["sync"]),
            "async_ttft_ms_median": statistics.median(r["ttft_ms_median"] for r in runs["async"]),
            "sync_ttft_ms_median": statistics.median(r["ttft_ms_median"] for r in runs["sync"]),
            "sync_over_async_paired_median": statistics.median(paired),
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report["summary"], indent=1))


if __name__ == "__main__":
    main()
