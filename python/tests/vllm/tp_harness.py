"""Tensor parallelism on CPU around the released vLLM 0.31.0 Scheduler (contracts T1-T3).

`TPEngine` runs the real `Scheduler` (OrbitKV as its connector, built by vLLM's own
factory, with `tensor_parallel_size = tp`) in the test process, and one worker-role
`OrbitKVConnector` per TP rank, each in its own process with its own CPU KV pages
(vLLM's `allocate_kv_cache`) and vLLM's own TP group (`init_distributed_environment` +
`initialize_model_parallel` over gloo, as vLLM's CPU workers do), so a worker learns its
rank exactly as in a served engine. A step broadcasts the `SchedulerOutput` to every
rank (pickled, as vLLM's multiprocess executor does), each rank runs the worker-side
connector calls in the V1 runner's order around an emulated forward, and the ranks'
outputs are combined by vLLM's own `KVOutputAggregator` before `update_from_output`.

The emulated forward writes KV bytes that are a pure function of (token prefix, layer,
rank): every rank's shard differs, so a rank that restored another rank's shard, or
stale bytes, fails the byte comparison.

Worker processes come from a forkserver that imported vLLM once (a spawned process per
rank would import it again each time).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from vllm_harness import (
    BLOCK,
    LAYERS,
    NUM_KV_HEADS,
    kv_bytes,
    make_kv_cache_config,
    make_scheduler,
    make_vllm_config,
    record_finished,
    run_worker_step,
    runner_output,
    sampled_tokens,
    scheduled_requests,
)

REPLY_TIMEOUT_S = 120.0


def rank_kv_bytes(prefix: Iterable[int], layer: int, rank: int) -> bytes:
    """KV content of the last token of `prefix` in `layer` on TP rank `rank`."""
    return kv_bytes(prefix, layer + 1000 * rank)


def tp_config(model_dir: Path, socket_path: str, tp: int, extra: dict[str, Any] | None = None) -> Any:
    cfg = make_vllm_config(model_dir, socket_path=socket_path, extra={"orbitkv.query_control": True, **(extra or {})})
    cfg.parallel_config.tensor_parallel_size = tp
    return cfg


@dataclass
class Write:
    """Positions [start, end) of a request, computed by this step's forward."""

    start: int
    end: int
    token_ids: list[int]  # all_token_ids[:end]
    block_ids: list[int]


# ---- the worker process ---------------------------------------------------------------


class _Rank:
    def __init__(self, rank: int, tp: int, port: int, model_dir: str, socket_path: str, extra: dict[str, Any]) -> None:
        import torch
        from vllm.config import set_current_vllm_config
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
        from vllm.v1.kv_cache_layout import KVCacheLayout
        from vllm.v1.worker.utils import allocate_kv_cache

        self.rank = rank
        self.cfg = tp_config(Path(model_dir), socket_path, tp, extra)
        with set_current_vllm_config(self.cfg):
            init_distributed_environment(
                world_size=tp,
                rank=rank,
                distributed_init_method=f"tcp://127.0.0.1:{port}",
                local_rank=rank,
                backend="gloo",
            )
            initialize_model_parallel(tensor_model_parallel_size=tp)
        layout = self.cfg.cache_config.kv_cache_layout
        self.kv_cache_config = make_kv_cache_config(128, layout)
        self.connector = KVConnectorFactory.create_connector(self.cfg, KVConnectorRole.WORKER, self.kv_cache_config)
        self.kv_caches = allocate_kv_cache(self.kv_cache_config, torch.device("cpu"), KVCacheLayout[layout])
        self.connector.register_kv_caches(self.kv_caches)
        self.torch = torch

    def _slot(self, layer: str, block_id: int, offset: int) -> Any:
        return self.kv_caches[layer].view(self.torch.uint8)[block_id, :, offset, :]

    def _forward(self, writes: list[Write]) -> None:
        for wr in writes:
            for pos in range(wr.start, wr.end):
                prefix = wr.token_ids[: pos + 1]
                for li, layer in enumerate(LAYERS):
                    raw = bytearray(rank_kv_bytes(prefix, li, self.rank))
                    data = self.torch.frombuffer(raw, dtype=self.torch.uint8)
                    self._slot(layer, wr.block_ids[pos // BLOCK], pos % BLOCK).copy_(data.view(NUM_KV_HEADS, -1))

    def step(self, so: Any, writes: list[Write]) -> Any:
        _, out = run_worker_step(self.connector, so, lambda: self._forward(writes))
        return out

    def check(self, block_ids: list[int], token_ids: list[int], n: int) -> str | None:
        for pos in range(n):
            prefix = token_ids[: pos + 1]
            for li, layer in enumerate(LAYERS):
                got = bytes(self._slot(layer, block_ids[pos // BLOCK], pos % BLOCK).contiguous().numpy().tobytes())
                if got != rank_kv_bytes(prefix, li, self.rank):
                    return f"rank {self.rank}: KV mismatch at position {pos}, layer {layer}"
        return None

    def zero(self) -> None:
        for t in self.kv_caches.values():
            t.zero_()

    def hang_loads(self, flag: str) -> None:
        """Fault injection: this rank's next load takes its part of the TP lease and
        acquires it (source addresses handed out: copies may be in flight), then blocks
        forever, as a process stopped mid-copy would; the file `flag` appears then."""
        side = self.connector.worker_side
        real = side._take_lease

        def take_then_hang(client: Any, ns: Any, spec: Any) -> Any:
            lease = real(client, ns, spec)
            client.acquire(lease)
            Path(flag).touch()
            while True:
                time.sleep(3600)

        side._take_lease = take_then_hang


def worker_main(conn: Connection, rank: int, tp: int, port: int, model_dir: str, socket_path: str, extra: dict) -> None:
    try:
        r = _Rank(rank, tp, port, model_dir, socket_path, extra)
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ok", os.getpid()))
    while True:
        cmd, *args = conn.recv()
        try:
            if cmd == "step":
                conn.send(("ok", r.step(*args)))
            elif cmd == "check":
                conn.send(("ok", r.check(*args)))
            elif cmd == "zero":
                r.zero()
                conn.send(("ok", None))
            elif cmd == "counters":
                conn.send(("ok", dict(r.connector.worker_side.counters)))
            elif cmd == "hang_loads":
                r.hang_loads(*args)
                conn.send(("ok", None))
            elif cmd == "shutdown":
                r.connector.shutdown()
                conn.send(("ok", None))
                return
            else:
                conn.send(("error", f"unknown command {cmd!r}"))
        except BaseException:
            conn.send(("error", traceback.format_exc()))


# ---- the engine (test process) --------------------------------------------------------

_CTX: Any = None


def _context() -> Any:
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(["vllm_env", "tp_harness"])
    return _CTX


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class TPEngine:
    tp: int
    scheduler: Any
    conns: list[Connection]
    procs: list[Any]
    aggregator: Any
    finished: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    dead: set[int] = field(default_factory=set)

    @classmethod
    def build(cls, model_dir: Path, socket_path: str, tp: int, extra: dict[str, Any] | None = None) -> TPEngine:
        from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator

        cfg = tp_config(model_dir, socket_path, tp, extra)
        kv_cache_config = make_kv_cache_config(128, cfg.cache_config.kv_cache_layout)
        cfg.cache_config.num_gpu_blocks = 128
        scheduler = make_scheduler(cfg, kv_cache_config)
        ctx = _context()
        port = _free_port()
        conns, procs = [], []
        for rank in range(tp):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=worker_main, args=(child, rank, tp, port, str(model_dir), socket_path, dict(extra or {}))
            )
            p.start()
            child.close()
            conns.append(parent)
            procs.append(p)
        eng = cls(tp, scheduler, conns, procs, KVOutputAggregator(tp))
        try:
            for rank in range(tp):
                eng._reply(rank)
        except BaseException:
            eng.kill_all()
            raise
        return eng

    @property
    def connector(self) -> Any:
        return self.scheduler.connector

    def _reply(self, rank: int, timeout: float = REPLY_TIMEOUT_S) -> Any:
        conn = self.conns[rank]
        if not conn.poll(timeout):
            raise AssertionError(f"rank {rank} did not answer within {timeout}s")
        status, value = conn.recv()
        if status != "ok":
            raise AssertionError(f"rank {rank} failed:\n{value}")
        return value

    def call(self, cmd: str, *args: Any, ranks: Iterable[int] | None = None) -> list[Any]:
        live = [r for r in (range(self.tp) if ranks is None else ranks) if r not in self.dead]
        for r in live:
            self.conns[r].send((cmd, *args))
        return [self._reply(r) for r in live]

    # ---- one engine step ---------------------------------------------------------------

    def step(self, sequential: bool = False) -> Any:
        so = self.scheduler.schedule()
        writes: list[Write] = []
        req_ids: list[str] = []
        sampled: list[list[int]] = []
        for request, start, end, block_ids in scheduled_requests(self.scheduler, so):
            writes.append(Write(start, end, list(request.all_token_ids[:end]), block_ids))
            req_ids.append(request.request_id)
            sampled.append(sampled_tokens(request, end))
        live = [r for r in range(self.tp) if r not in self.dead]
        if sequential:  # rank order: rank 0's step (its saves included) ends before rank 1's starts
            outs = [self.call("step", so, writes, ranks=[r])[0] for r in live]
        else:
            outs = self.call("step", so, writes)
        mros = [runner_output(req_ids, sampled, out) for out in outs]
        engine_outputs = self.scheduler.update_from_output(so, self.aggregator.aggregate(mros))
        record_finished(engine_outputs, self.finished, self.failed)
        return so

    def step_admitting(self, request: Any, max_steps: int = 200) -> Any:
        """Step until the step in which `request` leaves WAITING (admitted, or parked for
        its load: a probable hit's lookup runs in the background and vLLM asks again
        each step until it lands); returns that step's (executed) output."""
        from vllm.v1.request import RequestStatus

        for _ in range(max_steps):
            so = self.step()
            if request.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
                return so
            if not so.num_scheduled_tokens:
                time.sleep(0.002)
        raise AssertionError(f"{request.request_id} not admitted after {max_steps} steps")

    def run_until(self, pred: Any, max_steps: int = 200, what: str = "condition", **kw: Any) -> None:
        for _ in range(max_steps):
            if pred():
                return
            so = self.step(**kw)
            if not so.num_scheduled_tokens:
                time.sleep(0.005)  # let background loads progress
        raise AssertionError(f"{what} not reached after {max_steps} steps")

    def run_to_completion(self, req_ids: Iterable[str], **kw: Any) -> None:
        ids = set(req_ids)
        self.run_until(lambda: ids <= self.finished, what=f"completion of {sorted(ids)}", **kw)

    def check_pages(self, request: Any, num_tokens: int, ranks: Iterable[int] | None = None) -> None:
        """Every (live) rank holds its own shard's KV bytes for positions [0, num_tokens)."""
        (block_ids,) = self.scheduler.kv_cache_manager.get_block_ids(request.request_id)
        problems = self.call("check", list(block_ids), list(request.all_token_ids), num_tokens, ranks=ranks)
        assert problems == [None] * len(problems), problems

    def reset_hbm(self) -> None:
        """Forget every native (HBM) prefix and zero every rank's pages: the next
        request can only get its KV from OrbitKV or by computing it."""
        assert self.scheduler.reset_prefix_cache()
        self.call("zero")

    def kill(self, rank: int) -> None:
        os.kill(self.procs[rank].pid, signal.SIGKILL)
        self.procs[rank].join(30)
        self.dead.add(rank)

    def kill_all(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(30)

    def shutdown(self) -> None:
        """Workers drain and close (L6), then the scheduler's connector."""
        try:
            self.call("shutdown")
            for r, p in enumerate(self.procs):
                if r not in self.dead:
                    p.join(30)
        finally:
            self.kill_all()
            if self.scheduler.connector is not None:
                self.scheduler.connector.shutdown()
