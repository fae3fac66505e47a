"""vLLM's defaults work (K2), a cache failure is never the user's failure (L7), and
operators see OrbitKV in vLLM's own KV-connector stats.

Released vLLM 0.31.0 Scheduler + worker-role connector on CPU pages + real Manager
processes, SIGKILLed and restarted on the same socket.
"""

# ruff: noqa: E402 - each module skips (with its reason) before it imports vLLM
from __future__ import annotations

from vllm_env import skip_module_if_unavailable

skip_module_if_unavailable()

import dataclasses
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm.config import CacheConfig, KVTransferConfig
from vllm.v1.request import RequestStatus
from vllm_env import ManagerProcess
from vllm_harness import BLOCK, Engine, make_request, make_vllm_config, prompt_tokens, stop_all_threads

from orbitkv.engine.identity import fingerprint

pytestmark = [pytest.mark.vllm, pytest.mark.native]

HERE = Path(__file__).resolve().parent
PROMPT = prompt_tokens(100, seed=11)  # 6 full blocks + 4 tokens
FULL_BLOCKS = len(PROMPT) // BLOCK


def counters(engine: Engine) -> dict[str, int]:
    return dict(engine.connector.scheduler_side.counters)


def prefilled(engine: Engine, r: Any) -> Callable[[], bool]:
    return lambda: r.status == RequestStatus.RUNNING and r.num_computed_tokens >= len(r.prompt_token_ids)


def run_checked(engine: Engine, prompt: list[int]) -> Any:
    """Run `prompt` to completion; every prompt position's KV must be right and the
    request must finish normally (never FINISHED_ERROR)."""
    r = make_request(prompt)
    engine.scheduler.add_request(r)
    engine.run_until(prefilled(engine, r), what=f"prefill of {r.request_id}")
    engine.check_pages(r, len(prompt))
    engine.run_to_completion([r.request_id])
    assert r.request_id not in engine.failed, f"{r.request_id} finished with an error"
    assert r.get_finished_reason() is not None and r.status == RequestStatus.FINISHED_LENGTH_CAPPED
    return r


# ---- vLLM's defaults, read from the installed release --------------------------------


def test_the_release_defaults_this_suite_relies_on() -> None:
    fields = {f.name: f for f in dataclasses.fields(CacheConfig)}
    assert fields["prefix_caching_hash_algo"].default == "sha256"
    ktc = {f.name: f for f in dataclasses.fields(KVTransferConfig)}
    assert ktc["kv_load_failure_policy"].default == "fail"


def test_default_policy_is_recompute_once_orbitkv_loads(model_dir: Path, tmp_path: Path) -> None:
    """The Scheduler reads kv_load_failure_policy right after constructing its connector;
    OrbitKV (read_write) sets it to recompute there; save_only leaves it alone."""
    sock = str(tmp_path / "absent.sock")
    e = Engine.build(make_vllm_config(model_dir, socket_path=sock, hash_algo="sha256"))
    assert e.scheduler.recompute_kv_load_failures is True
    assert e.vllm_config.kv_transfer_config is not None
    assert e.vllm_config.kv_transfer_config.kv_load_failure_policy == "recompute"
    e.shutdown()
    s = Engine.build(make_vllm_config(model_dir, socket_path=sock, extra={"orbitkv.mode": "save_only"}))
    assert s.scheduler.recompute_kv_load_failures is False  # nothing OrbitKV loads can fail
    s.shutdown()


# ---- K2: the default sha256 chain ------------------------------------------------------


def _engine_process(model_dir: Path, sock: Path, mode: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHASHSEED", "PYTHONPATH")}
    r = subprocess.run(
        [sys.executable, str(HERE / "default_flags_engine.py"), str(model_dir), str(sock), mode, "5"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=str(HERE),
    )
    assert r.returncode == 0, f"engine process ({mode}) failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT ") :]))


def test_default_flags_two_engine_processes_share_a_prefix_byte_exact(
    model_dir: Path, orbit_manager: ManagerProcess
) -> None:
    """`vllm serve` defaults (EngineArgs with only the kv-transfer-config JSON): sha256
    block hashes, policy fail. One process saves, exits; a second process started
    after it (its own random str-hash seed) hits the whole prefix, byte-exact."""
    a = _engine_process(model_dir, orbit_manager.socket_path, "save")
    b = _engine_process(model_dir, orbit_manager.socket_path, "hit")
    for res in (a, b):
        assert res["hash_algo"] == "sha256"
        assert res["recompute_kv_load_failures"] is True and not res["failed"]
    assert a["block_hashes"] == b["block_hashes"] and len(a["block_hashes"]) == 3
    assert a["fingerprint"] == b["fingerprint"]
    assert a["counters"]["hit_blocks"] == 0 and a["counters"]["saved_blocks"] == 3
    # The second process loaded all 3 blocks (and check_pages passed in it).
    assert b["counters"]["hit_blocks"] == 3 and b["counters"]["loads_finished"] == 1
    assert b["counters"]["loads_failed"] == 0


def test_block_hash_identity_binds_what_the_pickles_depend_on(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.utils.hashing import sha256, sha256_cbor
    from vllm.v1.core.kv_cache_utils import init_none_hash

    from orbitkv.vllm import block_hashes

    sock = "/nonexistent/orbitkv.sock"

    def identity(algo: str) -> dict[str, Any]:
        e = Engine.build(make_vllm_config(model_dir, socket_path=sock, hash_algo=algo))
        try:
            return dict(e.connector.identity)
        finally:
            e.shutdown()

    base = identity("sha256")
    bh = base["block_hashes"]
    assert bh["serialization"] == {
        "format": "pickle",
        "protocol": pickle.HIGHEST_PROTOCOL,
        "pickler": "_pickle",
        "python": f"{sys.implementation.name}-{sys.version_info.major}.{sys.version_info.minor}",
    }
    # NONE_HASH as vLLM derives it (fixed seed for sha256 when PYTHONHASHSEED is unset).
    os.environ.pop("PYTHONHASHSEED", None)
    assert bh["none_hash"] == sha256("vllm-none-hash").hex()
    cbor = identity("sha256_cbor")["block_hashes"]
    assert cbor["serialization"] == {"format": "cbor-canonical"}
    assert cbor["none_hash"] == sha256_cbor("vllm-none-hash").hex()
    # Each dependency changes the namespace: another Python, protocol or seed never shares.
    monkeypatch.setattr(block_hashes.pickle, "HIGHEST_PROTOCOL", 4)
    assert fingerprint(identity("sha256")) != fingerprint(base)
    monkeypatch.undo()
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    seeded = identity("sha256")
    assert seeded["block_hashes"]["none_hash"] == sha256("7").hex()
    assert fingerprint(seeded) != fingerprint(base)
    monkeypatch.undo()
    assert fingerprint(identity("sha256")) == fingerprint(base)
    init_none_hash(sha256_cbor)  # the harness's chain for the rest of the suite


# ---- L7: a Manager SIGKILLed at each point, then restarted -----------------------------


@pytest.fixture
def restartable(orbit_manager: ManagerProcess, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """`state["mgr"]` is the live Manager; `kill()` SIGKILLs it, `restart()` starts a
    fresh one on the same socket (empty cache, new arena)."""
    state: dict[str, Any] = {"mgr": orbit_manager, "n": 0}

    def kill() -> None:
        mgr = state["mgr"]
        mgr.proc.send_signal(signal.SIGKILL)
        mgr.proc.wait(timeout=10)

    def restart() -> None:
        state["n"] += 1
        state["mgr"] = ManagerProcess(
            orbit_manager.socket_path, tmp_path / f"manager-{state['n']}.log", fault_injection=True
        )

    state["kill"], state["restart"] = kill, restart
    try:
        yield state
    finally:
        if state["mgr"] is not orbit_manager:
            state["mgr"].stop()


def hits_again(engine: Engine, mgr: ManagerProcess, seed: int) -> None:
    """After a restart: the engine's worker saves again, and its scheduler finds and
    loads what was saved (both roles reconnected), byte-exact."""
    deadline = time.monotonic() + 15
    while True:
        prompt = prompt_tokens(100, seed=seed)
        seed += 1000
        before = counters(engine)
        run_checked(engine, prompt)
        engine.run_until_drained()
        if counters(engine)["saved_blocks"] > before["saved_blocks"]:
            break
        assert time.monotonic() < deadline, "the worker never saved again after the restart"
        time.sleep(0.3)  # reconnection backs off (0.5 s, doubling)
    assert engine.scheduler.reset_prefix_cache(), "vLLM's own prefix cache must forget the prompt"
    before = counters(engine)
    r = run_checked(engine, prompt)
    after = counters(engine)
    assert after["hit_blocks"] - before["hit_blocks"] == FULL_BLOCKS, (before, after)
    assert after["loads_finished"] - before["loads_finished"] == 1
    assert r.request_id not in engine.failed
    engine.run_until_drained()
    engine.assert_drained()
    mgr.settled_stats(live_leases=0)


def restart_and_hit_again(b: Engine, restartable: dict[str, Any], seed: int) -> None:
    """Restart the killed Manager: `b` hits again (see hits_again), then shuts down."""
    restartable["restart"]()
    hits_again(b, restartable["mgr"], seed=seed)
    b.shutdown()


def save_prompt(model_dir: Path, mgr: ManagerProcess) -> None:
    a = Engine.build(make_vllm_config(model_dir, socket_path=str(mgr.socket_path)))
    run_checked(a, PROMPT)
    a.run_until_drained()
    assert counters(a)["saved_blocks"] == FULL_BLOCKS
    a.shutdown()


COPY_ENGINES = pytest.mark.parametrize("copy_engine", ["auto", "torch"])  # native copies / orbitkv.kvcopy


def default_engine(model_dir: Path, mgr: ManagerProcess, copy_engine: str = "auto") -> Engine:
    # kv_load_failure_policy left at vLLM's default ("fail" is also what the harness passes).
    extra = {"orbitkv.copy_engine": copy_engine}
    return Engine.build(make_vllm_config(model_dir, socket_path=str(mgr.socket_path), extra=extra))


@COPY_ENGINES
def test_manager_killed_before_a_lookup(model_dir: Path, restartable: dict[str, Any], copy_engine: str) -> None:
    save_prompt(model_dir, restartable["mgr"])
    b = default_engine(model_dir, restartable["mgr"], copy_engine)
    b.connector.scheduler_side.session.client()  # connected before the crash
    restartable["kill"]()
    run_checked(b, PROMPT)  # the lookup fails: a miss, computed locally
    c = counters(b)
    assert c["lookups"] == 0 and c["hit_blocks"] == 0 and c["manager_errors"] >= 1, c
    b.run_until_drained()
    restart_and_hit_again(b, restartable, seed=101)


@COPY_ENGINES
def test_manager_killed_between_lookup_and_load(model_dir: Path, restartable: dict[str, Any], copy_engine: str) -> None:
    save_prompt(model_dir, restartable["mgr"])
    b = default_engine(model_dir, restartable["mgr"], copy_engine)
    r = make_request(PROMPT)
    b.scheduler.add_request(r)
    so = b.schedule_admitting(r)  # the lookup found 6 blocks and pinned them; load planned
    assert r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert counters(b)["hit_blocks"] == FULL_BLOCKS
    restartable["kill"]()
    b.execute(so)  # the worker cannot reach the Manager: the blocks are reported failed
    b.run_until(prefilled(b, r), what="recompute after the failed load")
    b.check_pages(r, len(PROMPT))  # recomputed, not half-restored
    b.run_to_completion([r.request_id])
    assert r.request_id not in b.failed and r.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert counters(b)["loads_failed"] == 1
    b.run_until_drained()
    b.assert_drained()
    restart_and_hit_again(b, restartable, seed=202)


class _KillingClient:
    """Fault injection around the worker's real Client: SIGKILL the Manager at one point
    of a copy, then let the real call run on."""

    def __init__(self, real: Any, kill: Callable[[], None], at: str) -> None:
        self._real, self._kill, self._at = real, kill, at
        self.fired = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def _fire(self) -> None:
        if not self.fired:
            self.fired = True
            self._kill()

    # native copies: the worker's restore_pages acquires, then copies
    def restore_pages(self, lease: Any, *args: Any, **kw: Any) -> int:
        if self._at == "copy":
            self._real.acquire(lease)  # the lease is granted and its sources handed out
            self._fire()  # ... then the Manager dies before the bytes are copied
        return int(self._real.restore_pages(lease, *args, **kw))

    # orbitkv.kvcopy: a pool thread acquires, the step thread issues the copy later
    def acquire_packed(self, lease: Any) -> bytes:
        slots = bytes(self._real.acquire_packed(lease))
        if self._at == "copy":
            self._fire()
        return slots

    def begin_save(self, *args: Any, **kw: Any) -> Any:
        pending = self._real.begin_save(*args, **kw)
        if self._at == "save":
            self._fire()  # slots allocated, then the Manager dies before copy and commit
        return pending


def _inject(engine: Engine, kill: Callable[[], None], at: str) -> _KillingClient:
    session = engine.worker.worker_side.session
    # A load's copy goes through the loads' own connection, a save through the main one.
    name = "loader" if at == "copy" else "client"
    original = getattr(session, name)
    real = original()
    proxy = _KillingClient(real, kill, at)

    def wrapped() -> Any:
        c = original()
        return proxy if c is real else c  # only the connection alive at injection time

    setattr(session, name, wrapped)
    return proxy


@COPY_ENGINES
def test_manager_killed_during_the_copy(model_dir: Path, restartable: dict[str, Any], copy_engine: str) -> None:
    """The worker still maps the arena: a granted, acquired lease's bytes are copied
    after the Manager died, byte-exact; only the release is lost."""
    save_prompt(model_dir, restartable["mgr"])
    b = default_engine(model_dir, restartable["mgr"], copy_engine)
    proxy = _inject(b, restartable["kill"], "copy")
    r = make_request(PROMPT)
    b.scheduler.add_request(r)
    b.run_until(prefilled(b, r), what="prefill after the load")
    assert proxy.fired
    b.check_pages(r, len(PROMPT))
    b.run_to_completion([r.request_id])
    c = counters(b)
    assert r.request_id not in b.failed
    assert (c["hit_blocks"], c["loads_finished"], c["loads_failed"]) == (FULL_BLOCKS, 1, 0), c
    assert b.worker.worker_side.counters["bytes_restored"] == FULL_BLOCKS * b.connector.block_bytes
    b.run_until_drained()
    b.assert_drained()
    restart_and_hit_again(b, restartable, seed=303)


@COPY_ENGINES
def test_manager_killed_during_a_save(model_dir: Path, restartable: dict[str, Any], copy_engine: str) -> None:
    b = default_engine(model_dir, restartable["mgr"], copy_engine)
    proxy = _inject(b, restartable["kill"], "save")
    r = run_checked(b, PROMPT)
    assert proxy.fired and r.request_id not in b.failed
    b.run_until_drained()
    c = counters(b)
    assert c["saved_blocks"] == 0 and c["failed_saves"] >= 1, c
    b.assert_drained()
    restart_and_hit_again(b, restartable, seed=404)


@COPY_ENGINES
def test_manager_stalled_during_a_load(model_dir: Path, orbit_manager: ManagerProcess, copy_engine: str) -> None:
    """A Manager that stops answering between the lookup and the load: the worker's call
    times out (orbitkv.timeout_ms), the blocks are recomputed, the request finishes; once
    the Manager runs again the worker reconnects and the engine hits again."""
    save_prompt(model_dir, orbit_manager)
    extra = {"orbitkv.copy_engine": copy_engine, "orbitkv.timeout_ms": 300}
    b = Engine.build(make_vllm_config(model_dir, socket_path=str(orbit_manager.socket_path), extra=extra))
    r = make_request(PROMPT)
    b.scheduler.add_request(r)
    so = b.schedule_admitting(r)
    assert r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    stop_all_threads(orbit_manager.proc.pid)  # every Manager thread stopped
    try:
        b.execute(so)
        b.run_until(lambda: counters(b)["loads_failed"] == 1, what="the timed-out load reported failed")
    finally:
        os.kill(orbit_manager.proc.pid, signal.SIGCONT)
    b.run_until(prefilled(b, r), what="recompute after the timed-out load")
    b.check_pages(r, len(PROMPT))
    b.run_to_completion([r.request_id])
    assert r.request_id not in b.failed and r.status == RequestStatus.FINISHED_LENGTH_CAPPED
    b.run_until_drained()
    hits_again(b, orbit_manager, seed=505)
    b.shutdown()


@COPY_ENGINES
def test_a_stalled_manager_holds_one_worker_step_not_one_per_reconnect(
    model_dir: Path, orbit_manager: ManagerProcess, copy_engine: str
) -> None:
    """L7 under a long stall: the Manager stops answering while the engine keeps serving
    and saving. The save call that meets the stall waits `orbitkv.timeout_ms` once and
    drops the connection; every reconnection attempt after it (the back-off's 0.5, 1, 2,
    4 s) runs on a background thread, so no other step waits for the stalled Manager.
    (Made on the step, each attempt would hold a step for another full timeout: its
    connect is accepted by the kernel, its handshake never answered.) Requests finish
    normally meanwhile; once the Manager runs again the engine saves and hits again."""
    timeout_s = 1.0
    extra = {"orbitkv.copy_engine": copy_engine, "orbitkv.timeout_ms": int(timeout_s * 1000)}
    b = Engine.build(make_vllm_config(model_dir, socket_path=str(orbit_manager.socket_path), extra=extra))
    run_checked(b, prompt_tokens(100, seed=600))
    b.run_until_drained()
    assert counters(b)["saved_blocks"] > 0  # connected and saving before the stall
    slow: list[float] = []
    steps = 0
    stop_all_threads(orbit_manager.proc.pid)
    try:
        end = time.monotonic() + 8.0  # the back-off reaches 4 s: four attempts
        seed = 601
        while time.monotonic() < end:
            r = make_request(prompt_tokens(100, seed=seed))
            seed += 1
            b.scheduler.add_request(r)
            while r.request_id not in b.finished:
                assert r.request_id not in b.failed
                t0 = time.monotonic()
                b.step()
                took = time.monotonic() - t0
                steps += 1
                if took > 0.9 * timeout_s:
                    slow.append(round(took, 3))
    finally:
        os.kill(orbit_manager.proc.pid, signal.SIGCONT)
    assert steps > 20, steps
    assert len(slow) == 1, f"steps that waited on the stalled Manager: {slow}"
    assert counters(b)["failed_saves"] >= 1
    b.run_until_drained()
    hits_again(b, orbit_manager, seed=650)
    b.shutdown()


# ---- operators: OrbitKV in vLLM's KV-connector stats -----------------------------------


def test_orbitkv_counters_reach_vllm_stats_logging_and_prometheus(
    model_dir: Path, orbit_manager: ManagerProcess
) -> None:
    import prometheus_client
    from vllm.v1.metrics.loggers import LoggingStatLogger, PrometheusStatLogger

    save_prompt(model_dir, orbit_manager)
    b = default_engine(model_dir, orbit_manager)
    stats: list[dict[str, Any]] = []
    r = make_request(PROMPT)
    b.scheduler.add_request(r)
    deadline = time.monotonic() + 60
    while b.scheduler.requests:  # until the request finished and everything drained
        assert time.monotonic() < deadline, "the request did not finish"
        res = b.step()
        for eco in res.engine_outputs.values():
            ss = eco.scheduler_stats
            if ss is not None and ss.kv_connector_stats:
                stats.append(dict(ss.kv_connector_stats))
        if not res.scheduler_output.num_scheduled_tokens:
            time.sleep(0.002)  # let the background load progress
    assert r.request_id in b.finished and r.request_id not in b.failed
    total: dict[str, float] = {}
    durations: dict[str, list[float]] = {}
    for s in stats:
        for k, v in s.items():
            if isinstance(v, list):  # per-request durations (stats.SAMPLE_KEYS)
                durations.setdefault(k, []).extend(v)
            else:
                total[k] = total.get(k, 0) + v
    # Scheduler-side and worker-side counters, aggregated by vLLM's Scheduler.
    assert total["lookups"] == 1 and total["hit_blocks"] == FULL_BLOCKS and total["loads_finished"] == 1
    assert total["bytes_restored"] == FULL_BLOCKS * b.connector.block_bytes
    assert total["lookup_seconds"] > 0 and total["load_seconds"] > 0
    # One load, one duration: the same time the summed counter holds.
    assert len(durations["load_duration"]) == 1 and durations["load_duration"][0] == pytest.approx(
        total["load_seconds"]
    )
    # vLLM's loggers rebuild the stats through the connector class.
    prom = PrometheusStatLogger(b.vllm_config, engine_indexes=[0])
    log = LoggingStatLogger(b.vllm_config, engine_index=0)
    from vllm.v1.metrics.stats import SchedulerStats

    lines: list[str] = []
    for s in stats:
        ss = SchedulerStats(kv_connector_stats=s)
        prom.record(scheduler_stats=ss, iteration_stats=None, engine_idx=0)
        log.record(scheduler_stats=ss, iteration_stats=None, engine_idx=0)
    log.kv_connector_logging.log(log_fn=lambda fmt, *a: lines.append(fmt % a))
    assert lines and "hit_blocks=6" in lines[0] and "hit_rate=1.0" in lines[0], lines
    text = prometheus_client.generate_latest().decode()
    samples = {}
    for line in text.splitlines():
        if line.startswith("vllm:orbitkv_"):
            name, value = line.rsplit(" ", 1)
            samples[name.split("{")[0]] = float(value)
    assert samples["vllm:orbitkv_hit_blocks_total"] == FULL_BLOCKS
    assert samples["vllm:orbitkv_bytes_restored_total"] == total["bytes_restored"]
    assert samples["vllm:orbitkv_load_duration_seconds_count"] == 1
    assert samples["vllm:orbitkv_load_duration_seconds_sum"] == pytest.approx(total["load_seconds"])
    assert "load_duration_p99_ms" in lines[0], lines
    dashboard = json.loads((HERE.parents[2] / "deploy" / "grafana" / "orbitkv.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"vllm:orbitkv_[a-z0-9_]+", target["expr"])
    }
    assert len(queried) >= 10
    missing = sorted(queried - set(samples))
    assert not missing, f"the dashboard queries connector metrics vLLM does not expose: {missing}"
    b.shutdown()


def test_latency_samples_are_bounded_joined_and_summarised() -> None:
    from orbitkv.vllm.stats import MAX_SAMPLES, LatencySamples, OrbitKVConnectorStats, with_samples

    samples = LatencySamples()
    for i in range(MAX_SAMPLES + 5):
        samples.add("load_duration", 0.001 * (i % 100 + 1))
    samples.add("save_duration", 0.5)
    drained = samples.drain()
    assert len(drained["load_duration"]) == MAX_SAMPLES and samples.dropped == 5
    assert drained["save_duration"] == [0.5] and samples.drain() == {}
    assert with_samples(None, {}) is None
    a = with_samples(None, drained)
    assert a is not None and not a.is_empty()
    b = OrbitKVConnectorStats(data={"loads": 2, "load_duration": [0.25, 0.75]})
    a.aggregate(b)
    assert len(a.data["load_duration"]) == MAX_SAMPLES + 2 and a.data["loads"] == 2
    out = a.reduce()
    assert out["save_duration_p50_ms"] == 500.0 and out["save_duration_p99_ms"] == 500.0
    assert 1.0 <= out["load_duration_p50_ms"] <= out["load_duration_p99_ms"] <= 750.0
    assert OrbitKVConnectorStats(data={"load_duration": []}).is_empty()
