"""A worker's loads use a connection of their own (`ManagerSession.loader`), so the engine
step's save calls never wait behind a load's `acquire` while the Manager stages its blocks
from the SSD tier (a connection serves one call at a time). Real Manager, real SSD files.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from vllm_env import skip_module_if_unavailable

skip_module_if_unavailable()

from engine_manager import manager_in_short_dir  # noqa: E402

from orbitkv.vllm.config import parse_settings  # noqa: E402
from orbitkv.vllm.native import ManagerSession  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.native]

MiB = 1 << 20
BLOCK_BYTES = 2 * MiB
LOAD = 96  # blocks per staged load: 192 MiB from SSD


def key(i: int) -> bytes:
    return hashlib.sha256(b"load-connection-%d" % i).digest()


def save_during_load(start_load: Callable[[], None], save_call: Callable[[], None]) -> tuple[float, float]:
    """Run `start_load` (an acquire) on a thread and, 5 ms after it started, `save_call`:
    (how long the save call took, how long the acquire took), in seconds."""
    started = threading.Event()
    took: list[float] = []

    def load() -> None:
        started.set()
        t = time.perf_counter()
        start_load()
        took.append(time.perf_counter() - t)

    th = threading.Thread(target=load)
    th.start()
    started.wait()
    time.sleep(0.005)  # the acquire is on the wire
    t = time.perf_counter()
    save_call()
    save_took = time.perf_counter() - t
    th.join()
    return save_took, took[0]


def test_a_step_save_call_does_not_wait_behind_a_load_staging_from_ssd(tmp_path: Path) -> None:
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    args = ("--ssd-dir", str(ssd), "--ssd-capacity", "1GiB", "--ssd-write-policy", "eager")
    args += ("--ssd-mode", "kernel", "--cache-policy", "lru")  # kernel: any file system; lru: oldest leave DRAM first
    dram = f"{LOAD * BLOCK_BYTES // MiB}MiB"  # one load's worth
    with manager_in_short_dir(tmp_path / "log", "okv-lc", extra_args=args, dram_size=dram) as mgr:
        settings = parse_settings({"orbitkv.socket_path": str(mgr.socket_path)})
        session = ManagerSession(settings, b"L" * 32, BLOCK_BYTES)
        try:
            main, ns = session.client(), session.namespace(b"")
            payload = bytes(range(256)) * (BLOCK_BYTES // 256)
            saved = 3 * LOAD  # DRAM holds LOAD blocks: the first 2 * LOAD end on SSD only
            for i in range(saved):
                main.save(ns, [key(i)], [payload])
                deadline = time.monotonic() + 30
                while main.stats()["ssd_blocks"] < i + 1:  # written behind before it can leave DRAM
                    assert time.monotonic() < deadline, f"block {i} never reached the SSD"
                    time.sleep(0.002)

            def staged_load(client: Any, ns_: Any, first: int) -> tuple[Callable[[], None], Any]:
                lease = client.lookup(ns_, [key(i) for i in range(first, first + LOAD)])
                assert lease.hit_blocks == LOAD and len(lease.ssd_blocks) == LOAD, "the load must come from SSD"
                return (lambda: client.acquire(lease)), lease

            def save_call() -> None:
                main.abort_save(main.begin_save(ns, [key(10**6)]))

            # The worker's way: the load on the loads' connection, the save on the step's.
            loader = session.loader()
            assert loader.session_id != main.session_id
            load, lease = staged_load(loader, session.loader_namespace(b""), 0)
            save_took, load_took = save_during_load(load, save_call)
            loader.release(lease)
            assert save_took < load_took / 3, (save_took, load_took)
            # One connection for both (the way before): the save waits out the staging.
            load, lease = staged_load(main, ns, LOAD)
            save_took, load_took = save_during_load(load, save_call)
            main.release(lease)
            assert save_took > (load_took - 0.005) / 2, (save_took, load_took)
        finally:
            session.close()
        mgr.settled_stats(live_leases=0, live_saves=0)
