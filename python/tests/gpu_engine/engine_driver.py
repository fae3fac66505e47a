"""One released-vLLM engine process on a GPU, driven by a JSON plan; the GPU engine
suite (test_vllm_gpu.py) and benches/engine_ttft.py start one of these per role.

    python engine_driver.py PLAN.json

The plan names the model directory, the `LLM(...)` keyword arguments (the connector
JSON among them, or none), the Manager socket (for its counters), and a list of
phases; the driver writes one JSON result with a record per phase to `plan["out"]`.
Prompts are token ids built from `[seed, length]` segments (see `prompt_tokens`), so
the test and every process build the same prompt without a tokenizer.

Phases (`op`):
- `generate`: the prompts one request at a time (`together: false`, the default) or
  as one batch; per prompt the greedy tokens, the logprob of each chosen token (exact
  floats), `num_cached_tokens`, the wall time, and the Manager's counter deltas.
- `reset_prefix_cache`: vLLM's own HBM prefix cache emptied (the connector untouched).
- `abort_mid_load`: one request added, the engine stepped until the Manager pinned its
  hit (a lease is live) and once more (the worker starts the copy), the request
  aborted, the engine stepped until idle; then the Manager's live leases, stepping the
  engine until they reach zero or 10 s passed. The abort and kill phases need the
  engine core in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): a step of a
  separate engine core process returns only once a request produced output.
- `kill_manager_mid_load`: one request added, the engine stepped until the Manager
  pinned its hit, the Manager SIGKILLed (`manager_pid`), the engine stepped until the
  request finished; its tokens and logprobs recorded.
- `kill_worker_mid_load` (TP > 1): one request added, the engine stepped until the
  Manager pinned its hit, one rank's worker process SIGKILLed (`rank`, default 1, found
  through the in-process executor's worker handles), the engine stepped until the
  request finished or vLLM's executor failed (its policy for a dead worker: the engine
  stops); the outcome, the outputs that finished, and the error.
- `steps`: the prompts added at once (all misses) and the engine stepped until idle,
  each step timed (the step-time side of benches/engine_ttft.py's scheduler cost).
- `serve_trace`: the prompts in order with at most `concurrency` in flight; per request
  the time to first token and to the end (benches/engine_serving.py).
- `settle`: waits until the Manager's committed-block count stops changing (the
  worker commits a save once its copy completed, a step or more after the request).

Every phase also records vLLM's own counters (`llm.get_metrics()`: preemptions, local
and external prefix-cache hits) when the plan sets `"metrics": true`, and the time
the connector's scheduler-side hooks took when `ORBITKV_TIME_SCHEDULER_HOOKS=1` (the
engine core must then run in this process: `VLLM_ENABLE_V1_MULTIPROCESSING=0`).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

Segments = list[list[int]]


def prompt_tokens(segments: Segments, vocab: int = 32000) -> list[int]:
    """Concatenated runs of pseudo-random token ids: `[[seed, length], ...]`."""
    out: list[int] = []
    for seed, length in segments:
        rng = random.Random(seed)
        out.extend(rng.randrange(100, vocab - 100) for _ in range(length))
    return out


class ManagerCounters:
    """The Manager's counters through a control-only client (no arena mapping)."""

    KEYS = ("hit_blocks_total", "lookups_total", "blocks_committed_total", "live_leases")

    def __init__(self, socket_path: str | None) -> None:
        self.socket_path = socket_path

    def read(self) -> dict[str, int]:
        if not self.socket_path:
            return {}
        from orbitkv import _native

        try:
            with _native.Client(self.socket_path, timeout_ms=2000, map_arena=False) as c:
                stats = c.stats()
        except Exception as exc:  # the Manager may be down on purpose (kill phase)
            return {"error": repr(exc)}  # type: ignore[dict-item]
        return {k: int(stats[k]) for k in self.KEYS if k in stats}

    def settled_leases(self, step: Any = None, timeout: float = 10.0) -> int:
        """Live leases once they reach zero, or the last value at the deadline (releases
        are sent without a reply, so they land a moment later). `step`: called between
        reads, for an engine core in this process that only advances when stepped."""
        deadline = time.monotonic() + timeout
        last = -1
        while time.monotonic() < deadline:
            last = int(self.read().get("live_leases", -1))
            if last == 0:
                return 0
            if step is not None:
                step()
            time.sleep(0.02)
        return last


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after if k in before and k != "live_leases"}


def record_output(out: Any) -> dict[str, Any]:
    c = out.outputs[0]
    lps: list[float] = []
    for tok, step in zip(c.token_ids, c.logprobs or [], strict=False):
        lps.append(float(step[tok].logprob))
    return {
        "tokens": list(c.token_ids),
        "logprobs": lps,
        "num_cached_tokens": out.num_cached_tokens,
        "finish_reason": c.finish_reason,
    }


HOOK_SECONDS: dict[str, float] = {}


def time_scheduler_hooks() -> None:
    """Wraps the connector's scheduler-side methods with timers (instrumentation of the
    real connector; nothing is replaced). Only meaningful with the engine core in this
    process."""
    from orbitkv.vllm.connector import SCHEDULER_METHODS, OrbitKVConnector

    for name in SCHEDULER_METHODS:
        inner = getattr(OrbitKVConnector, name)

        def timed(self: Any, *a: Any, _inner: Any = inner, _name: str = name, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return _inner(self, *a, **kw)
            finally:
                HOOK_SECONDS[_name] = HOOK_SECONDS.get(_name, 0.0) + time.perf_counter() - t

        setattr(OrbitKVConnector, name, timed)


VLLM_METRICS = (
    "vllm:num_preemptions",
    "vllm:prefix_cache_hits",
    "vllm:external_prefix_cache_hits",
    "vllm:prefix_cache_queries",
    "vllm:external_prefix_cache_queries",
)


class Driver:
    def __init__(self, plan: dict[str, Any]) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from runner_env import set_runner_env

        set_runner_env()  # V1 where the pin has it (0.31.0, 0.33.0)
        if os.environ.get("ORBITKV_TIME_SCHEDULER_HOOKS") == "1":
            time_scheduler_hooks()
        from vllm import LLM, SamplingParams

        self.plan = plan
        self.counters = ManagerCounters(plan.get("socket"))
        kwargs = dict(plan["llm"])
        kwargs.setdefault("skip_tokenizer_init", True)
        if plan.get("metrics"):
            kwargs["disable_log_stats"] = False
        t0 = time.perf_counter()
        self.llm = LLM(model=plan["model"], **kwargs)
        self.startup_s = time.perf_counter() - t0
        self.SamplingParams = SamplingParams

    def engine_config(self) -> dict[str, Any]:
        """What the engine resolved: the vLLM version, block size and KV cache allocation."""
        import vllm

        cache = self.llm.llm_engine.vllm_config.cache_config
        return {
            "vllm": vllm.__version__,
            "block_size": cache.block_size,
            "extensible_kv_cache": getattr(cache, "enable_extensible_kv_cache", None),
        }

    def params(self, phase: dict[str, Any]) -> Any:
        return self.SamplingParams(
            max_tokens=int(phase.get("max_tokens", 8)),
            temperature=0.0,
            logprobs=0,
            detokenize=False,
            ignore_eos=True,
        )

    def prompts(self, phase: dict[str, Any]) -> list[Any]:
        from vllm.inputs import TokensPrompt

        return [TokensPrompt(prompt_token_ids=prompt_tokens(p)) for p in phase["prompts"]]

    def generate(self, phase: dict[str, Any]) -> dict[str, Any]:
        prompts = self.prompts(phase)
        sp = self.params(phase)
        before = self.counters.read()
        results: list[dict[str, Any]] = []
        if phase.get("together"):
            t = time.perf_counter()
            outs = self.llm.generate(prompts, sp, use_tqdm=False)
            wall = time.perf_counter() - t
            results = [record_output(o) | {"batch_wall_s": wall} for o in outs]
        else:
            for p in prompts:
                b = self.counters.read() if phase.get("per_prompt_counters") else {}
                t = time.perf_counter()
                (o,) = self.llm.generate([p], sp, use_tqdm=False)
                r = record_output(o) | {"wall_s": time.perf_counter() - t}
                if b:
                    r["manager"] = delta(b, self.counters.read())
                results.append(r)
        after = self.counters.read()
        return {"outputs": results, "manager": delta(before, after)}

    def _step_until_pinned(self, engine: Any, timeout: float = 60.0) -> int:
        """Steps until the Manager holds a lease (the lookup of the added request hit)."""
        steps = 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            engine.step()
            steps += 1
            if int(self.counters.read().get("live_leases", 0)) > 0:
                return steps
        raise RuntimeError(f"no lease appeared in the Manager after {steps} steps")

    def abort_mid_load(self, phase: dict[str, Any]) -> dict[str, Any]:
        engine = self.llm.llm_engine
        (prompt,) = self.prompts(phase)
        engine.add_request("abort-me", prompt, self.params(phase))
        steps = self._step_until_pinned(engine)
        for _ in range(int(phase.get("extra_steps", 1))):  # let the worker start the copy
            engine.step()
            steps += 1
        engine.abort_request(["abort-me"])  # the external id (vLLM adds a suffix inside)
        outs: list[Any] = []
        deadline = time.monotonic() + 60
        while engine.has_unfinished_requests() and time.monotonic() < deadline:
            outs.extend(engine.step())
        return {
            "steps_before_abort": steps,
            "unfinished_after": engine.has_unfinished_requests(),
            "outputs": [record_output(o) for o in outs if o.finished],
            "live_leases_settled": self.counters.settled_leases(step=engine.step),
        }

    def kill_manager_mid_load(self, phase: dict[str, Any]) -> dict[str, Any]:
        engine = self.llm.llm_engine
        (prompt,) = self.prompts(phase)
        engine.add_request("killed-manager", prompt, self.params(phase))
        steps = self._step_until_pinned(engine)
        os.kill(int(phase["manager_pid"]), signal.SIGKILL)
        t = time.perf_counter()
        outs: list[Any] = []
        deadline = time.monotonic() + 120
        while engine.has_unfinished_requests() and time.monotonic() < deadline:
            outs.extend(o for o in engine.step() if o.finished)
        return {
            "steps_before_kill": steps,
            "unfinished_after": engine.has_unfinished_requests(),
            "seconds_to_finish": time.perf_counter() - t,
            "outputs": [record_output(o) for o in outs],
        }

    def kill_worker_mid_load(self, phase: dict[str, Any]) -> dict[str, Any]:
        engine = self.llm.llm_engine
        executor = engine.model_executor  # set when the engine core runs in this process
        rank = int(phase.get("rank", 1))
        (victim,) = [h for h in executor.workers if h.rank == rank]
        (prompt,) = self.prompts(phase)
        engine.add_request("killed-worker", prompt, self.params(phase))
        steps = self._step_until_pinned(engine)
        os.kill(victim.proc.pid, signal.SIGKILL)
        outs: list[Any] = []
        error = None
        deadline = time.monotonic() + 120
        try:
            while engine.has_unfinished_requests() and time.monotonic() < deadline:
                outs.extend(o for o in engine.step() if o.finished)
        except Exception as exc:  # vLLM's policy for a dead worker: the executor fails
            error = f"{type(exc).__name__}: {exc}"
        return {
            "steps_before_kill": steps,
            "killed_rank": rank,
            "killed_pid": victim.proc.pid,
            "engine_error": error,
            "outputs": [record_output(o) for o in outs],
        }

    def steps(self, phase: dict[str, Any]) -> dict[str, Any]:
        """Per-step wall time of `count` engine steps over the prompts (all misses)."""
        engine = self.llm.llm_engine
        sp = self.params(phase)
        for i, p in enumerate(self.prompts(phase)):
            engine.add_request(f"step-{i}", p, sp)
        times: list[float] = []
        while engine.has_unfinished_requests():
            t = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t)
        return {"step_s": times}

    def serve_trace(self, phase: dict[str, Any]) -> dict[str, Any]:
        """The prompts in order, at most `concurrency` in flight (a request enters as soon
        as one finishes, as in a server); per request the time from entry to its first
        token and to its end, and the tokens it had cached."""
        from vllm.inputs import TokensPrompt

        engine = self.llm.llm_engine
        sp = self.params(phase)
        todo = list(enumerate(phase["prompts"]))[::-1]
        conc = int(phase["concurrency"])
        entered: dict[str, float] = {}
        first: dict[str, float] = {}
        recs: dict[str, dict[str, Any]] = {}
        before = self.counters.read()
        t0 = time.perf_counter()
        while todo or engine.has_unfinished_requests():
            while todo and len(entered) - len(recs) < conc:
                i, segs = todo.pop()
                rid = f"trace-{i}"
                engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt_tokens(segs)), sp)
                entered[rid] = time.perf_counter()
            for o in engine.step():
                now = time.perf_counter()
                if o.outputs and o.outputs[0].token_ids and o.request_id not in first:
                    first[o.request_id] = now
                if o.finished:
                    recs[o.request_id] = {
                        "ttft_s": first.get(o.request_id, now) - entered[o.request_id],
                        "e2e_s": now - entered[o.request_id],
                        "num_cached_tokens": o.num_cached_tokens,
                        "prompt_tokens": len(o.prompt_token_ids or []),
                        "generated": len(o.outputs[0].token_ids),
                    }
        wall = time.perf_counter() - t0
        return {
            "wall_s": wall,
            "requests": [recs[k] for k in sorted(recs, key=lambda r: int(r.split("-")[1]))],
            "manager": delta(before, self.counters.read()),
        }

    def settle(self, phase: dict[str, Any]) -> dict[str, Any]:
        quiet = float(phase.get("quiet_s", 1.0))
        deadline = time.monotonic() + float(phase.get("timeout_s", 30.0))
        last = self.counters.read().get("blocks_committed_total")
        since = time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.counters.read().get("blocks_committed_total")
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return {"blocks_committed_total": last, "settled": True}
        return {"blocks_committed_total": last, "settled": False}

    def vllm_metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for m in self.llm.get_metrics():
            if m.name in VLLM_METRICS and hasattr(m, "value"):
                out[m.name] = out.get(m.name, 0.0) + float(m.value)
        return out

    def shutdown(self, timeout: float = 60.0) -> str:
        """vLLM's own shutdown (the connector's drain and last commits run in it), bounded."""
        import threading

        done = threading.Event()

        def stop() -> None:
            try:
                self.llm.llm_engine.engine_core.shutdown()
            finally:
                done.set()

        threading.Thread(target=stop, daemon=True).start()
        return "clean" if done.wait(timeout) else f"timed out after {timeout:.0f} s"

    def reset_prefix_cache(self, phase: dict[str, Any]) -> dict[str, Any]:
        return {"reset": bool(self.llm.reset_prefix_cache())}

    # The ops a plan's phase may name: each runs the method of that name, given the phase.
    OPS = (
        "generate",
        "reset_prefix_cache",
        "abort_mid_load",
        "kill_manager_mid_load",
        "kill_worker_mid_load",
        "steps",
        "serve_trace",
        "settle",
    )

    def run(self) -> dict[str, Any]:
        result: dict[str, Any] = {"startup_s": self.startup_s, "engine": self.engine_config(), "phases": []}
        for phase in self.plan["phases"]:
            op = phase["op"]
            if op not in self.OPS:
                raise ValueError(f"unknown phase op {op!r}")
            t = time.perf_counter()
            rec = getattr(self, op)(phase)
            rec |= {"op": op, "tag": phase.get("tag", op), "phase_s": time.perf_counter() - t}
            if self.plan.get("metrics") and op != "kill_worker_mid_load":  # the engine is gone after it
                rec["vllm_metrics"] = self.vllm_metrics()
            if HOOK_SECONDS:
                rec["scheduler_hook_s"] = dict(HOOK_SECONDS)
            result["phases"].append(rec)
            print(f"driver: phase {rec['tag']} done in {rec['phase_s']:.2f} s", flush=True)
        return result


def main() -> int:
    plan = json.loads(Path(sys.argv[1]).read_text())
    out = Path(plan["out"])
    driver: Driver | None = None
    try:
        driver = Driver(plan)
        result = driver.run()
        result["ok"] = True
    except Exception:
        result = {"ok": False, "error": traceback.format_exc()}
        print(result["error"], file=sys.stderr, flush=True)
    if driver is not None:
        result["shutdown"] = driver.shutdown()
    out.write_text(json.dumps(result))
    # vLLM's engine core and workers are torn down at interpreter exit; a hang there must
    # not hold the suite: the result is already written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    sys.exit(main())
