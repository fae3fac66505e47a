"""Full-miss overhead of OrbitKV per vLLM Scheduler step (released vLLM 0.31.0, CPU).

Same process, same frozen workload, interleaved repetitions (A/B, then B/A, ...):
  * `none`    - the real Scheduler without a KV connector;
  * `null`    - the real Scheduler with a connector that does nothing
                (`benches/null_connector.py`), worker role included: the floor that
                vLLM's own per-connector plumbing costs any connector;
  * `orbitkv` - the real Scheduler with OrbitKVConnector and a real Manager process,
                plus the worker-role connector over real CPU KV pages.
Every prompt is unique, so every lookup misses and every complete block is saved.

Reported per engine step (median over steps, then median over repetitions):
  * `scheduler_us` - `schedule()` + `update_from_output()` (the Scheduler step);
  * `worker_us`    - the worker-side connector calls of the step (bind, start_load_kv,
                     wait_for_save incl. the saves' copies, get_transfer_results, ...);
  * `hooks_us`     - the part of `scheduler_us` spent inside OrbitKV's own
                     scheduler-side hooks (a profiler clock, reported apart; the rest
                     of the difference is vLLM's own per-connector plumbing);
  * overhead ratios of OrbitKV vs none for the scheduler step and for the whole
    (scheduler + worker connector) step, split into vLLM's plumbing (null vs none)
    and OrbitKV's own share (orbitkv vs null).
The emulated model forward is not timed (there is no model on a CPU box); on a real
engine the step also contains the forward, so these ratios are upper bounds.

Admission (`admission` in the JSON): a burst of `--admission-requests` requests added at
once, per admitted request, in the same run:
  * `null`          - the null connector (the floor);
  * `orbitkv_miss`  - every request misses (the presence table answers, no message);
  * `orbitkv_hit`   - every prompt was saved beforehand (probable hit: background
                      lookup, vLLM asked again next step);
  * `orbitkv_hit_inline` - the same with `orbitkv.async_lookups = false` (the lookup
                      round trip on the scheduler thread), for comparison.
Reported: the scheduler-thread time inside `get_num_new_matched_tokens` per request
(all its calls summed; median, p90, mean over requests), the whole scheduler-thread
time (schedule + update_from_output, every step until all requests finished) per
request, and the time from the burst to each request's answer (the connector
returned a number: miss, or hit with its load planned). Hit and miss runs do
different work after admission (loads instead of prefill), so only the hook cost
compares them directly.

Run inside the pinned venv (scripts/vllm-venv.sh) with the native wheel installed:
    python benches/vllm_overhead.py [--reps 5] [--requests 64] [--prompt-tokens 512]
Writes bench-results/vllm_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python" / "tests" / "vllm"))
sys.path.insert(0, str(ROOT / "python" / "tests" / "support"))  # host_copier: the byte oracle
sys.path.insert(0, str(ROOT / "benches"))  # null_connector, by kv_connector_module_path

import vllm_env  # noqa: E402  (sets the CPU/offline environment before vLLM loads)

vllm_env.skip_module_if_unavailable = lambda: None  # not under pytest here
if vllm_env.UNAVAILABLE:
    raise SystemExit(f"vllm_overhead: {vllm_env.UNAVAILABLE}")

import torch  # noqa: E402
from host_copier import HostCopier  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm_harness import (  # noqa: E402
    Engine,
    kv_connector_output,
    make_request,
    make_vllm_config,
    prompt_tokens,
    runner_output,
    write_tiny_model,
)

# The bench Manager's arena is 128 MiB (4 KiB pages): prefaulting it takes tens of
# milliseconds; this waits well past that.
PREFAULT_WAIT_S = 0.3


def _step_output(engine: Engine, so: Any) -> ModelRunnerOutput:
    req_ids = list(so.num_scheduled_tokens)
    sampled = []
    for r in req_ids:
        req = engine.scheduler.requests[r]
        sampled.append([7] if req.num_computed_tokens >= req.num_tokens else [])
    return runner_output(req_ids, sampled)


def _worker_hooks(w: Any, so: Any, out: ModelRunnerOutput) -> None:
    """The worker-role connector's hooks of one step (the model's output already made)."""
    meta = so.kv_connector_metadata
    w.handle_preemptions(meta)
    w.bind_connector_metadata(meta)
    w.start_load_kv(None)
    w.wait_for_save()
    out.kv_connector_output = kv_connector_output(w, so)


def build_engine(model_dir: Path, socket_path: str, connector: str | None, extra: dict[str, Any] | None = None) -> Any:
    """The released scheduler and a CPU worker with `connector` ("null": vLLM's
    NullConnector, "orbitkv", or None: no connector at all), 4,096 KV blocks."""
    kv_connector, module = {
        None: (None, None),
        "null": ("NullConnector", "null_connector"),
        "orbitkv": ("OrbitKVConnector", "orbitkv.vllm"),
    }[connector]
    cfg = make_vllm_config(
        model_dir,
        socket_path=socket_path,
        kv_connector=kv_connector,
        module_path=module,
        max_num_batched_tokens=2048,
        extra=extra,
    )
    engine = Engine.build(cfg, num_blocks=4096)  # no worker connector for None
    if connector == "orbitkv":
        # Serving starts long after connect (model load): open both sessions now and
        # let the worker's background arena prefault finish before measuring.
        engine.connector.scheduler_side.session.client()
        engine.worker.worker_side.session.client()
        time.sleep(PREFAULT_WAIT_S)
    return engine


def run_variant(
    variant: str, model_dir: Path, socket_path: str, prompts: list[list[int]], max_tokens: int
) -> dict[str, Any]:
    connector = {"none": None, "null": "null", "orbitkv": "orbitkv"}[variant]
    engine = build_engine(model_dir, socket_path, connector)
    sched = engine.scheduler
    for p in prompts:
        sched.add_request(make_request(p, max_tokens=max_tokens))
    sched_us: list[float] = []
    worker_us: list[float] = []
    hooks_us: list[float] = []
    per_hook: dict[str, float] = {}
    hook_clock = _instrument(engine.connector, per_hook) if variant == "orbitkv" else [0.0]
    w = engine.worker
    while sched.requests:
        hook_clock[0] = 0.0
        t0 = time.perf_counter()
        so = sched.schedule()
        t1 = time.perf_counter()
        out = _step_output(engine, so)
        t2 = time.perf_counter()
        if w is not None:
            _worker_hooks(w, so, out)
        t3 = time.perf_counter()
        sched.update_from_output(so, out)
        t4 = time.perf_counter()
        if so.total_num_scheduled_tokens:
            sched_us.append(((t1 - t0) + (t4 - t3)) * 1e6)
            worker_us.append((t3 - t2) * 1e6)
            hooks_us.append(hook_clock[0] * 1e6)
    result: dict[str, Any] = {
        "steps": len(sched_us),
        "scheduler_us_median": statistics.median(sched_us),
        "scheduler_us_p90": statistics.quantiles(sched_us, n=10)[-1],
        "worker_us_median": statistics.median(worker_us),
        "orbitkv_hooks_us_median": statistics.median(hooks_us),
        # Means too: a lookup RPC lands in few steps, so medians hide most of it.
        "scheduler_us_mean": statistics.fmean(sched_us),
        "orbitkv_hooks_us_mean": statistics.fmean(hooks_us),
        "step_us_median": statistics.median(a + b for a, b in zip(sched_us, worker_us, strict=True)),
    }
    if variant == "orbitkv":
        # each hook's time per step, over the steps that scheduled tokens
        result["hook_us_per_step"] = {k: v / len(sched_us) * 1e6 for k, v in sorted(per_hook.items())}
        c = engine.connector.scheduler_side.counters
        result["lookups"] = c["lookups"]
        result["hit_blocks"] = c["hit_blocks"]
        result["saved_blocks"] = c["saved_blocks"]
        result["bytes_saved"] = engine.worker.worker_side.counters["bytes_saved"]
        engine.shutdown()
    return result


def _instrument(connector: Any, per_hook: dict[str, float] | None = None) -> list[float]:
    """Accumulate time spent inside OrbitKV's scheduler-side hooks (profiler clock);
    `per_hook` (if given) sums each hook's own time over the run, in seconds."""
    from orbitkv.vllm.connector import SCHEDULER_METHODS

    clock = [0.0]
    for name in SCHEDULER_METHODS:
        fn = getattr(connector, name)

        def timed(*args: Any, _fn: Any = fn, _name: str = name, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return _fn(*args, **kw)
            finally:
                dt = time.perf_counter() - t
                clock[0] += dt
                if per_hook is not None:
                    per_hook[_name] = per_hook.get(_name, 0.0) + dt

        setattr(connector, name, timed)
    return clock


def admission_run(
    variant: str, model_dir: Path, socket_path: str, prompts: list[list[int]], max_tokens: int
) -> dict[str, Any]:
    """One burst of `prompts`: per-request scheduler-thread cost of the connector's
    `get_num_new_matched_tokens` and time to its answer (see the module docs)."""
    extra = {"orbitkv.async_lookups": False} if variant == "orbitkv_hit_inline" else None
    engine = build_engine(model_dir, socket_path, "null" if variant == "null" else "orbitkv", extra)
    per_req: dict[str, float] = {}
    first_call: dict[str, float] = {}
    calls: dict[str, int] = {}
    answered: dict[str, float] = {}
    fn = engine.connector.get_num_new_matched_tokens

    def timed(request: Any, num_computed_tokens: int) -> Any:
        t = time.perf_counter()
        r = fn(request, num_computed_tokens)
        t2 = time.perf_counter()
        per_req[request.request_id] = per_req.get(request.request_id, 0.0) + (t2 - t)
        first_call.setdefault(request.request_id, t2 - t)
        calls[request.request_id] = calls.get(request.request_id, 0) + 1
        if r[0] is not None and request.request_id not in answered:
            answered[request.request_id] = t2
        return r

    engine.connector.get_num_new_matched_tokens = timed
    sched, w = engine.scheduler, engine.worker
    reqs = [make_request(p, max_tokens=max_tokens) for p in prompts]
    thread_s = 0.0
    steps = 0
    t_start = time.perf_counter()
    for r in reqs:
        sched.add_request(r)
    while sched.requests:
        t0 = time.perf_counter()
        so = sched.schedule()
        t1 = time.perf_counter()
        out = _step_output(engine, so)
        _worker_hooks(w, so, out)
        t2 = time.perf_counter()
        sched.update_from_output(so, out)
        t3 = time.perf_counter()
        thread_s += (t1 - t0) + (t3 - t2)
        steps += 1
        if not so.total_num_scheduled_tokens:
            time.sleep(0.0002)  # a real engine's busy loop; lets background work land
    costs = sorted(per_req[r.request_id] * 1e6 for r in reqs)
    waits = sorted((answered[r.request_id] - t_start) * 1e3 for r in reqs)
    result: dict[str, Any] = {
        "requests": len(reqs),
        "hook_us_per_request_median": statistics.median(costs),
        "hook_us_per_request_p90": statistics.quantiles(costs, n=10)[-1],
        "hook_us_per_request_mean": statistics.fmean(costs),
        # The first call alone (the presence probe, or the lookup's hand-off) and how
        # often vLLM asked per request (again after a `None`, or when it could not
        # allocate the request's blocks yet).
        "hook_first_call_us_median": statistics.median(first_call[r.request_id] * 1e6 for r in reqs),
        "hook_calls_per_request_median": statistics.median(calls[r.request_id] for r in reqs),
        # Every schedule() + update_from_output() of the run (until all finished),
        # per request: what the burst cost the scheduler thread in all.
        "scheduler_thread_us_per_admitted_request": thread_s / len(reqs) * 1e6,
        "steps": steps,
        "answer_ms_median": statistics.median(waits),
        "answer_ms_max": waits[-1],
    }
    if variant != "null":
        c = engine.connector.scheduler_side.counters
        for k in ("lookups", "presence_misses", "async_lookups", "hit_blocks", "manager_errors"):
            result[k] = c[k]
        engine.shutdown()
    return result


def admission_probe(
    model_dir: Path, socket_path: str, requests: int, prompt_tokens_n: int, max_tokens: int, reps: int
) -> dict[str, Any]:
    variants = ["null", "orbitkv_miss", "orbitkv_hit", "orbitkv_hit_inline"]
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for rep in range(reps):
        saved = [prompt_tokens(prompt_tokens_n, 7_000_000 * (rep + 1) + i) for i in range(requests)]
        # Save the hit prompts through an engine of their own (its worker stores them).
        saver = Engine.build(make_vllm_config(model_dir, socket_path=socket_path, max_num_batched_tokens=4096), 4096)
        ids = []
        for p in saved:
            r = make_request(p, max_tokens=1)
            saver.scheduler.add_request(r)
            ids.append(r.request_id)
        saver.run_to_completion(ids, max_steps=100_000)
        saver.run_until_drained(max_steps=100_000)
        saver.shutdown()
        order = variants[rep % 4 :] + variants[: rep % 4]
        for variant in order:
            if variant.startswith("orbitkv_hit"):
                prompts = saved
            else:
                seed = 9_000_000 * (rep + 1) + 100_000 * variants.index(variant)
                prompts = [prompt_tokens(prompt_tokens_n, seed + i) for i in range(requests)]
            runs[variant].append(admission_run(variant, model_dir, socket_path, prompts, max_tokens))

    def med(v: str, k: str) -> float:
        return statistics.median(r[k] for r in runs[v])

    summary: dict[str, Any] = {
        v: {
            k: med(v, k)
            for k in (
                "hook_first_call_us_median",
                "hook_calls_per_request_median",
                "hook_us_per_request_median",
                "hook_us_per_request_p90",
                "hook_us_per_request_mean",
                "scheduler_thread_us_per_admitted_request",
                "answer_ms_median",
                "answer_ms_max",
            )
        }
        for v in variants
    }
    for v in variants[1:]:
        summary[v]["hook_us_vs_null_median"] = (
            summary[v]["hook_us_per_request_median"] - summary["null"]["hook_us_per_request_median"]
        )
        summary[v]["scheduler_thread_us_vs_null"] = (
            summary[v]["scheduler_thread_us_per_admitted_request"]
            - summary["null"]["scheduler_thread_us_per_admitted_request"]
        )
    return {
        "workload": {"requests": requests, "prompt_tokens": prompt_tokens_n, "max_tokens": max_tokens, "reps": reps},
        "summary": summary,
        "runs": runs,
    }


def layout_probe(model_dir: Path, socket_path: str, blocks: int, reps: int) -> dict[str, Any]:
    """Save + restore throughput of the worker copy path per KV layout (real Manager).

    Llama-8B-like pages (8 KV heads x 128 head size, fp16, 16 tokens): 64 KiB per layer
    page, 4 layers -> 256 KiB per block. Input to the `orbitkv.kv_cache_layout` default.
    """
    import numpy as np
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache
    from vllm_harness import make_kv_cache_config

    from orbitkv.vllm.metadata import LoadSpec, SaveSpec

    layers = [f"model.layers.{i}.self_attn.attn" for i in range(4)]
    setups: dict[str, Any] = {}
    for layout in ("LBNHC", "BLHNC"):
        kc = make_kv_cache_config(blocks * 2, layout, num_kv_heads=8, head_size=128, layers=layers)
        cfg = make_vllm_config(model_dir, socket_path=socket_path, layout=layout)
        conn = KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, kc)
        kv = allocate_kv_cache(kc, torch.device("cpu"), KVCacheLayout[layout])
        conn.register_kv_caches(kv)
        setups[layout] = (conn, kv, [], [])
    rng = np.random.default_rng(1)
    # Repetition 0 warms up (first touch of arena pages in this process); layouts
    # alternate order so neither always runs on fresher arena slots.
    for rep in range(reps + 1):
        order = ["LBNHC", "BLHNC"] if rep % 2 == 0 else ["BLHNC", "LBNHC"]
        for layout in order:
            conn, kv, save_s, load_s = setups[layout]
            side = conn.worker_side
            pages = side.cpu_pages
            assert pages is not None
            copier = HostCopier(pages.geometry, pages.flat)
            for t in kv.values():
                raw = t.view(torch.uint8)
                raw.copy_(torch.from_numpy(rng.integers(0, 256, raw.shape, np.uint8)))
            hashes = tuple(os.urandom(32) for _ in range(blocks))
            src = tuple(range(blocks))
            dst = tuple(range(blocks, 2 * blocks))
            expect = copier.gather(list(src)).tobytes()
            t0 = time.perf_counter()
            side._save_one(SaveSpec(f"probe-{rep}", b"", hashes, src))
            t1 = time.perf_counter()
            res = side._load(LoadSpec(f"probe-{rep}", b"", hashes, dst))
            t2 = time.perf_counter()
            assert not res.failed_block_ids and copier.gather(list(dst)).tobytes() == expect
            if rep > 0:
                save_s.append(t1 - t0)
                load_s.append(t2 - t1)
    out: dict[str, Any] = {}
    for layout, (conn, _, save_s, load_s) in setups.items():
        side = conn.worker_side
        nbytes = blocks * side.session.block_bytes
        out[layout] = {
            "block_bytes": side.session.block_bytes,
            "direct_block_copies": side.cpu_pages.geometry.block_span,
            "save_gbps_median": nbytes / statistics.median(save_s) / 1e9,
            "restore_gbps_median": nbytes / statistics.median(load_s) / 1e9,
            "save_us_per_block": statistics.median(save_s) / blocks * 1e6,
            "restore_us_per_block": statistics.median(load_s) / blocks * 1e6,
        }
        conn.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--admission-requests", type=int, default=64)
    ap.add_argument("--admission-reps", type=int, default=3)
    ap.add_argument("--only-admission", action="store_true", help="skip the step-overhead runs and the layout probe")
    ap.add_argument("--out", default=str(ROOT / "bench-results" / "vllm_overhead.json"))
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="okv-bench-"))
    model_dir = write_tiny_model(tmp / "tiny-llama")
    manager = vllm_env.ManagerProcess(tmp / "m.sock", tmp / "manager.log", fault_injection=False, dram_size="128MiB")
    variants = ["none", "null", "orbitkv"]
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    try:
        admission = admission_probe(
            model_dir,
            str(manager.socket_path),
            args.admission_requests,
            args.prompt_tokens,
            args.max_tokens,
            args.admission_reps,
        )
        # A full presence table answers "maybe" for everything: misses become lookups.
        st = manager.stats()
        admission["manager_presence"] = {k: st[k] for k in ("presence_slots", "presence_entries", "presence_saturated")}
        if args.only_admission:
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"benchmark": "vllm_overhead", "admission": admission}, indent=2))
            print(json.dumps(admission["summary"], indent=1))
            return
        for rep in range(args.reps):
            # Rotate the order so no variant always runs first or last.
            order = variants[rep % 3 :] + variants[: rep % 3]
            for variant in order:
                # Fresh prompts per repetition and variant: every lookup is a miss.
                seed = 1_000_000 * (rep + 1) + 300_000 * variants.index(variant)
                prompts = [prompt_tokens(args.prompt_tokens, seed + i) for i in range(args.requests)]
                runs[variant].append(
                    run_variant(variant, model_dir, str(manager.socket_path), prompts, args.max_tokens)
                )
        layouts = layout_probe(model_dir, str(manager.socket_path), blocks=128, reps=8)
    finally:
        manager.stop()

    def med(variant: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[variant])

    none_sched, okv_sched = med("none", "scheduler_us_median"), med("orbitkv", "scheduler_us_median")
    null_sched = med("null", "scheduler_us_median")
    none_step, okv_step = med("none", "step_us_median"), med("orbitkv", "step_us_median")
    null_step = med("null", "step_us_median")

    def paired(a: str, b: str, key: str) -> float:
        # Median over repetitions of the same-repetition ratio: robust to drift.
        return statistics.median(x[key] / y[key] - 1.0 for x, y in zip(runs[a], runs[b], strict=True))

    report = {
        "benchmark": "vllm_overhead",
        "workload": {
            "requests": args.requests,
            "prompt_tokens": args.prompt_tokens,
            "max_tokens": args.max_tokens,
            "block_size": 16,
            "kv_cache_layout": "LBNHC",
            "block_bytes": 2048,
            "reps": args.reps,
            "full_miss": True,
        },
        "environment": {
            "vllm": vllm_env.PINNED_VLLM,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
        },
        "none": {
            "scheduler_us_median": none_sched,
            "scheduler_us_mean": med("none", "scheduler_us_mean"),
            "step_us_median": none_step,
        },
        "null": {
            "scheduler_us_median": null_sched,
            "scheduler_us_mean": med("null", "scheduler_us_mean"),
            "worker_us_median": med("null", "worker_us_median"),
            "step_us_median": null_step,
        },
        "orbitkv": {
            "scheduler_us_median": okv_sched,
            "worker_us_median": med("orbitkv", "worker_us_median"),
            "scheduler_us_mean": med("orbitkv", "scheduler_us_mean"),
            "hooks_us_median": med("orbitkv", "orbitkv_hooks_us_median"),
            "hooks_us_mean": med("orbitkv", "orbitkv_hooks_us_mean"),
            "hook_us_per_step_median": {
                k: statistics.median(r["hook_us_per_step"].get(k, 0.0) for r in runs["orbitkv"])
                for k in runs["orbitkv"][0]["hook_us_per_step"]
            },
            "step_us_median": okv_step,
        },
        "scheduler_overhead_ratio": okv_sched / none_sched - 1.0,
        # Median over repetitions of the paired (same repetition) ratio: robust to drift.
        "scheduler_overhead_ratio_paired": paired("orbitkv", "none", "scheduler_us_median"),
        # vLLM's plumbing for any connector, and OrbitKV's own share above it.
        "null_vs_none_scheduler_ratio_paired": paired("null", "none", "scheduler_us_median"),
        "orbitkv_vs_null_scheduler_ratio_paired": paired("orbitkv", "null", "scheduler_us_median"),
        "orbitkv_vs_null_step_ratio_paired": paired("orbitkv", "null", "step_us_median"),
        "orbitkv_hooks_share_of_none_step": med("orbitkv", "orbitkv_hooks_us_median") / none_sched,
        "step_overhead_ratio": okv_step / none_step - 1.0,
        "runs": runs,
        "admission": admission,
        "layout_probe": layouts,
        "note": (
            "Step times exclude the model forward (none exists on CPU); on a real engine the "
            "forward dominates the step, so these ratios are upper bounds of the overhead."
        ),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    keys = (
        "none",
        "null",
        "orbitkv",
        "scheduler_overhead_ratio",
        "scheduler_overhead_ratio_paired",
        "null_vs_none_scheduler_ratio_paired",
        "orbitkv_vs_null_scheduler_ratio_paired",
        "orbitkv_vs_null_step_ratio_paired",
        "orbitkv_hooks_share_of_none_step",
        "step_overhead_ratio",
        "layout_probe",
    )
    print(json.dumps(admission["summary"], indent=1))
    print(json.dumps({k: report[k] for k in keys}, indent=1))


if __name__ == "__main__":
    main()
